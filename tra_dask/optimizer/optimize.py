"""``td.optimize``: the paper's initial plan, then the cheapest equivalent plan.

Named stages, each recorded on the plan (``plan.stages``, ``plan.explain(stage=...)``):

1. ``compile`` — the paper's translation of the expression into its initial IA plan
   (of a *sketch* of the expression when it is large: :mod:`.sketch`);
2. ``search`` — the cost-based search over equivalent plans (:mod:`.search`);
3. ``replay`` — only after a sketch: the best sketch plans rebuilt at full size and
   costed exactly;
4. ``check`` — the chosen plan computes the expression's relations (keys and chunk
   shapes of every output) and fits the memory limit.

Fusion (:mod:`tra_dask.physical.work`) runs after them: the plan :func:`optimize`
returns is fused (and, under the time objective, the fastest of the search's plans
once fused: :func:`fastest_fused`).  ``optimize(..., until=stage)`` stops after a stage and returns the unfused
plan as it stands then (dask's ``optimize_until``).
"""

from __future__ import annotations

import dataclasses
import time

from ..logical import Source, flatten_outputs
from ..node import canonical, toposort
from ..physical import PlacementError
from ..physical.work import plan_work
from .compile import _resolve_placements, compile
from .cost import plan_cost
from .target import Target, search_options
from .objective import FastestTime, as_objective
from .plan import Plan, Stage
from .rules import RULES
from .search import SearchResult, fusable_tasks, search
from .sketch import NotReplayable, make_sketch, replay
from .time import fusion_for

__all__ = ["optimize", "as_target", "NoPlanFits", "STAGES"]

STAGES = ("compile", "search", "replay", "check")  # what optimize(..., until=) takes, in order


_REPLAY_TUPLES = 4_000_000  # full-size tuples worth of sketch plans replayed (at least one plan)


class NoPlanFits(ValueError):
    """No plan of an expression fits the memory limit per site (the message names the
    smallest peak the search found and what would help)."""


def optimize(expr, target=None, cost_model: str | None = None, memory_limit=None, placements=None, *,
             sites: int | None = None, objective=None, cluster=None, options="auto", budget: int | None = None,
             beam: int | None = None, rules=RULES, sketch: bool | None = None, until: str | None = None) -> Plan:
    """Compile ``expr`` for a :class:`~tra_dask.optimizer.target.Target` and search for
    the cheapest equivalent plan.

    ``target``: what the plan runs on — a :class:`~tra_dask.optimizer.target.Target`
    (sites, the :class:`~tra_dask.optimizer.cluster.ClusterSpec`, the memory limit per
    site, fixed placements of data already there, the cost model), or a number of
    sites.  As a convenience the Target's fields may be given as keywords instead
    (``sites=``, ``cluster=``, ``memory_limit=`` — bytes per site, a number or a size
    string like ``"1GB"``; default: the cluster's memory per site when a cluster is
    given, else none —, ``placements=``, ``cost_model=`` ``"exact"`` or ``"paper"``);
    with a Target they must not be.

    ``objective`` says what cheapest means: ``"time"`` (the default,
    :class:`~tra_dask.optimizer.objective.FastestTime`: least predicted seconds on the
    target's cluster, or the defaults), ``"bytes"``
    (:class:`~tra_dask.optimizer.objective.FewestBytes`: the fewest floats moved under
    the cost model, the busiest site's flops at an exchange rate, tasks and tuples as
    tie-breakers) or any :class:`~tra_dask.optimizer.objective.Objective`.  Every plan
    reports its predicted ``cost.seconds``.  Memory is a hard constraint.

    ``options``: how hard to search — a name in
    :data:`~tra_dask.optimizer.target.SEARCH_OPTIONS` (``"auto"``, ``"quick"``,
    ``"full"``) or a :class:`~tra_dask.optimizer.target.SearchOptions`; ``beam``
    (placements kept per plan node), ``budget`` (rewrites tried before the search stops
    early) and ``sketch`` (plan a large expression on a sketch of it, :mod:`.sketch`)
    override the named options' fields.
    ``until``: stop after that stage (one of :data:`STAGES`) and return the plan as
    it stands then, before fusion, its ``.stages`` those that ran: ``"compile"`` the
    paper's initial plan of the expression (at full size, never of a sketch),
    ``"search"`` the search's best plan (replayed at full size after a sketch search,
    as ``"replay"``), ``"check"`` that plan checked.  None: the whole pipeline.

    The returned Plan is immutable and has ``.alternatives`` (the other plans
    considered, cheapest first, each with its ``.cost``), ``.compiled`` (the initial
    plan), ``.search`` (budget used, whether it was cut short, the sketch) and
    ``.stages`` (module doc).
    """
    target = as_target(target, sites=sites, cluster=cluster, memory_limit=memory_limit, placements=placements,
                       cost_model=cost_model)
    opts = search_options(options).replace(beam=beam, budget=budget, sketch=sketch)
    if until is not None and until not in STAGES:
        raise ValueError(f"optimize(until={until!r}): no such stage; the stages are {', '.join(STAGES)} "
                         f"(or None for the whole pipeline, fusion included)")
    sites, cost_model, cluster, placements = target.sites, target.cost_model, target.cluster, target.placement_map
    budget, beam = opts.budget, opts.beam
    obj = as_objective(objective, target.memory_limit, cluster)
    outputs, rebuild = flatten_outputs(expr)
    stages: list = []
    res = None
    sk = None
    if opts.sketch and until != "compile":
        sources = [n for n in toposort(outputs) if isinstance(n, Source)]
        sk = make_sketch(outputs, sites, _resolve_placements(placements, sources, sites))
    works = {}  # the node works of full-size plans, derived once for their cost and their fusion
    if sk is not None:
        res = _search_sketch(expr, outputs, sk, sites, cost_model, obj, opts, rules, stages, works)
    if res is None:
        stages.clear()
        t0 = time.perf_counter()
        compiled = compile(expr, sites, placements=placements, cost_model=cost_model)
        stages.append(Stage("compile", compiled, time.perf_counter() - t0, "the paper's initial IA plan"))
        if until == "compile":
            return Plan(compiled.outputs, rebuild, sites, cost_model, expr, stages=stages)
        t0 = time.perf_counter()
        res = search(list(compiled.outputs), rules, model=cost_model, objective=obj, budget=budget, beam=beam,
                     rounds=opts.rounds, bound_rounds=opts.bound_rounds, least_traffic=opts.least_traffic)
        stages.append(Stage("search", _plan(res.best, rebuild, sites, cost_model, expr, res.best_cost),
                            time.perf_counter() - t0, _search_note(res)))
    else:
        def compiled():  # the full-size initial plan, made only when asked for
            return compile(expr, sites, placements=placements, cost_model=cost_model)
    if until in ("search", "replay"):
        return Plan(res.best, rebuild, sites, cost_model, expr, cost=res.best_cost, stages=stages)
    t0 = time.perf_counter()
    _check(res, outputs, obj)
    best = _plan(res.best, rebuild, sites, cost_model, expr, res.best_cost)
    stages.append(Stage("check", best, time.perf_counter() - t0,
                        "outputs are the expression's relations; peak within the memory limit"))
    if until == "check":
        return Plan(res.best, rebuild, sites, cost_model, expr, cost=res.best_cost, stages=stages)
    timed = obj if hasattr(obj, "annotate") else FastestTime(cluster=cluster)  # seconds are always reported
    fuse = _Fuser(timed, fusion_for(timed.spec(sites)), sites, cost_model, rebuild, expr, works if works else None)

    chosen, chosen_cost = res.best, res.best_cost
    if isinstance(obj, FastestTime):  # fusion removes tasks the search counted: the fastest fused plan
        chosen, chosen_cost = fastest_fused([(res.best, res.best_cost), *res.alternatives], obj, fuse)

        t0 = time.perf_counter()
        chosen, chosen_cost, note = less_traffic(chosen, chosen_cost, [(res.best, res.best_cost), *res.alternatives],
                                                 obj, fuse)
        if note:
            stages.append(Stage("traffic", None, time.perf_counter() - t0, note))

    plan = fuse.plan(chosen, chosen_cost, compiled=compiled, search=res, stages=stages,
                     alternatives=Alternatives(chosen, [(res.best, res.best_cost), *res.alternatives], fuse))
    fuse.chosen()
    return plan


def searched_alike(plan, made_with, wanted) -> bool:
    """Whether ``plan``, planned with the search options ``made_with``, is a plan the
    options ``wanted`` would find too: the two differ in the beam, the least-traffic
    candidates and the rounds past the beam only, and the plan's search kept every
    placement signature at every node (``SearchResult.beam_unbound``: no beam bound, no
    budget cut it short, no sketch), so any beam searches the same candidates at the same
    costs (no node was past the beam, and each node's least-traffic candidate was kept
    as the best of its signature)."""
    a, b = search_options(made_with), search_options(wanted)
    return (getattr(plan.search, "beam_unbound", False)
            and dataclasses.replace(a, name=b.name, beam=b.beam, least_traffic=b.least_traffic,
                                    bound_rounds=b.bound_rounds) == b)


def as_target(target=None, *, sites=None, cluster=None, memory_limit=None, placements=None,
              cost_model=None) -> Target:
    """The :class:`~tra_dask.optimizer.target.Target` :func:`optimize` plans for: ``target``
    itself, or one built from a number of sites and the keywords (which a Target
    given must not be combined with)."""
    fields = dict(cluster=cluster, memory_limit=memory_limit, placements=placements, cost_model=cost_model)
    if isinstance(target, Target):
        given = [k for k, v in fields.items() if v is not None] + (["sites"] if sites is not None else [])
        if given:
            raise ValueError(f"optimize: {', '.join(given)} given with a Target; it is the Target's "
                             f"(use target.replace({given[0]}=...))")
        return target
    if target is not None and sites is not None:
        raise ValueError(f"optimize: sites given twice ({target!r} and sites={sites!r})")
    sites = target if sites is None else sites
    if sites is None:
        raise TypeError("optimize() needs a target: a td.Target, or sites=<number of sites>")
    return Target(sites, **{k: v for k, v in fields.items() if v is not None})


def fastest_fused(pairs, obj, fuse) -> tuple:
    """``(outputs, fused cost)``: the plan of ``pairs`` (``(outputs, unfused cost)``, the
    search's) that the time objective ``obj`` ranks first once fused — exactly, by
    branch and bound.  Fusion only removes tasks (each worth ``task_overhead`` seconds
    and nothing else), so a plan's seconds with every one of its
    :func:`fusable_tasks` fused bound its fused seconds from below; plans are fused
    in the order of that bound, until the bound passes the best fused plan found
    (deriving a plan's fusion costs a few ms)."""
    overhead = obj.spec(pairs[0][1].sites).task_overhead
    bounded = []
    for i, (outs, cost) in enumerate(pairs):
        key = obj(cost)
        bounded.append(((key[0], key[1], key[2] - overhead * fusable_tasks(outs, cost)), i))
    bounded.sort()
    best = best_key = None
    seen: set = set()
    for bound, i in bounded:
        if best_key is not None and bound > best_key[:3]:
            break  # this plan, and every one after it, is slower even were all its fusable tasks fused
        outs, cost = pairs[i]
        if tuple(outs) in seen:
            continue
        seen.add(tuple(outs))
        cost = fuse.cost(outs, cost)
        key = obj(cost)
        if best_key is None or key < best_key:
            best, best_key = (outs, cost), key
    return best


# the time objective's choice under the model's error (less_traffic): a plan that moves
# more than TRAFFIC_RATIO times another's floats must be predicted faster than it by more
# than the objective's band; the search's best TRAFFIC_POOL plans are compared
TRAFFIC_RATIO = 1.5
TRAFFIC_POOL = 24


def within_band(seconds: float, floats: int, other_seconds: float, other_floats: int, band: float) -> bool:
    """The time objective's rule under its own error, for one pair: whether a choice
    predicted ``seconds`` that moves ``floats`` gives way to another predicted
    ``other_seconds`` that moves ``other_floats`` — it moves more than
    :data:`TRAFFIC_RATIO` times the other's floats and is not predicted at least
    ``band`` faster."""
    return floats > TRAFFIC_RATIO * other_floats and seconds > (1.0 - band) * other_seconds


def band_note(what: str, seconds: float, floats: int, other_seconds: float, other_floats: int,
              band: float) -> str:
    """What :func:`within_band` passed over, for ``plan.explain()``."""
    return (f"chosen over a {what} predicted {1 - seconds / other_seconds:.1%} faster that moves "
            f"{floats / max(other_floats, 1):.1f}x its floats ({floats:,} against {other_floats:,}): a gain "
            f"within the model's error band ({band:.0%}) does not buy that much more traffic")


def less_traffic(chosen, cost, pairs, obj, fuse) -> tuple:
    """``(outputs, cost, note)``: the time objective's choice made robust to its own
    error.  The fastest plan is kept unless one of the search's best
    :data:`TRAFFIC_POOL` plans moves a :data:`TRAFFIC_RATIO`-th of its floats or less
    and is predicted within ``obj.band`` of its time (the model's error band: a gain
    below it is noise, a many-times larger transfer is a bet against the model); then
    the fastest such plan is taken, and the rule applied again from it.  So a plan
    chosen moves more than 1.5x the floats of another considered plan only if it is
    predicted at least ``band`` faster.  ``note`` says what was passed over and why
    (empty when the fastest plan stands)."""
    band = getattr(obj, "band", 0.0)
    if not band:
        return chosen, cost, ""
    pool = []
    for outs, c in pairs[:TRAFFIC_POOL]:
        if outs != chosen and not obj(c)[0]:  # (over the memory limit: never)
            pool.append((outs, c))
    first, notes = cost, []
    overhead = obj.spec(cost.sites).task_overhead
    while True:
        better = []
        for outs, c in pool:
            if cost.floats_moved > TRAFFIC_RATIO * c.floats_moved:
                if cost.seconds <= (1.0 - band) * (obj.seconds(c) - c.tasks * overhead):
                    continue  # faster by the band even were all its tasks fused: no need to fuse it
                c = fuse.cost(outs, c)
                if within_band(cost.seconds, cost.floats_moved, c.seconds, c.floats_moved, band):
                    better.append((c.seconds, c.floats_moved, len(better), outs, c))
        if not better:
            break
        _, _, _, outs, c = min(better)
        notes.append(band_note("plan", cost.seconds, cost.floats_moved, c.seconds, c.floats_moved, band))
        pool = [(o, k) for o, k in pool if o != outs]
        chosen, cost = outs, c
    if notes and cost is not first:
        return chosen, cost, "; then ".join(notes)
    return chosen, cost, ""


class _Fuser:
    """Plans after fusion (:mod:`tra_dask.physical.work`: a pass after placement),
    their costs counting only the tasks that remain, with seconds under ``timed``;
    each plan's fusion derived once."""

    def __init__(self, timed, fusion, sites, cost_model, rebuild, expr, node_works: dict | None = None):
        self.timed, self.fusion, self.sites, self.cost_model = timed, fusion, sites, cost_model
        self.rebuild, self.expr = rebuild, expr
        self.works: dict = {}  # id(outputs) -> their work
        # node works the exact costs of full-size plans derived (a replay's), reused by
        # their fusion; forgotten once the plan is chosen (:meth:`chosen`)
        self.node_works = node_works

    def work(self, outs):
        w = self.works.get(id(outs))
        if w is None:
            w = self.works[id(outs)] = plan_work(outs, fusion=self.fusion, works=self.node_works)
        return w

    def chosen(self) -> "_Fuser":
        """Done choosing: the node works kept for reuse are let go (the plans' works hold theirs)."""
        self.node_works = None
        return self

    def cost(self, outs, cost):
        n = len(self.work(outs).into)
        return cost if cost.seconds is not None and cost.fused == n else self.timed.annotate(cost.with_fused(n))

    def plan(self, outs, cost, **kw) -> Plan:
        return Plan(outs, self.rebuild, self.sites, self.cost_model, self.expr, cost=self.cost(outs, cost),
                    fusion=self.fusion, work=self.work(outs), **kw)

    def without_data(self) -> "_Fuser":
        """The same cluster and model, holding no expression (nor works over its sources)."""
        return _Fuser(self.timed, self.fusion, self.sites, self.cost_model, None, None)


class Alternatives:
    """A plan's alternatives (the search's runners-up, in its order, the chosen plan
    left out), fused and timed when first read: deriving each one's fusion costs a
    few ms, which a first submission should not pay for plans it never shows.  The
    plan cache keeps a data-free copy by :meth:`rebound` without deriving them."""

    def __init__(self, chosen, pairs, fuse: _Fuser):
        self.chosen, self.pairs, self.fuse = chosen, list(pairs), fuse
        self._count = None

    def __call__(self) -> list:
        return [self.fuse.plan(outs, cost) for outs, cost in self._distinct()]

    def __len__(self) -> int:  # without fusing them
        if self._count is None:
            self._count = len(self._distinct())
        return self._count

    def _distinct(self) -> list:
        seen, out = [self.chosen], []
        for outs, cost in self.pairs:
            if all(outs != o for o in seen):
                seen.append(outs)
                out.append((outs, cost))
        return out

    def rebound(self, remake) -> "Alternatives":
        """The same, data-free, over the nodes ``remake(outputs, cost) -> (outputs,
        cost)`` gives."""
        return Alternatives(remake(self.chosen, None)[0], [remake(o, c) for o, c in self.pairs],
                            self.fuse.without_data())


def _plan(outputs, rebuild, sites, cost_model, expr, cost) -> Plan:
    return Plan(outputs, rebuild, sites, cost_model, expr, cost=cost)


def _search_note(res: SearchResult) -> str:
    return (f"{res.candidates} candidate plans, {res.rewrites} rewrites"
            + (" (budget exhausted)" if res.truncated else ""))


def _search_sketch(expr, outputs, sk, sites, cost_model, obj, opts, rules, stages,
                   works: dict | None = None) -> SearchResult | None:
    """Search the sketch, replay its best plans at full size (:mod:`.sketch`); None
    when no sketch plan replays (the caller then searches at full size).  ``works``:
    where the replayed plans' node works are kept (their fusion reuses them)."""
    t0 = time.perf_counter()
    compiled = compile(tuple(sk.outputs), sites, placements=sk.placements, cost_model=cost_model)
    stages.append(Stage("compile", compiled, time.perf_counter() - t0,
                        f"the paper's initial IA plan of a sketch: blocks / {sk.factor:.2f} along long dims, "
                        f"largest relation {sk.tuples:,} tuples (the expression's: {sk.full_tuples:,})"))
    t0 = time.perf_counter()
    res = search(list(compiled.outputs), rules, model=cost_model, objective=obj, budget=opts.budget, beam=opts.beam,
                 rounds=opts.rounds, bound_rounds=opts.bound_rounds, least_traffic=opts.least_traffic,
                 tidy=False)  # (a move idle on the sketch may move at full size)
    stages.append(Stage("search", _plan(res.best, compiled.rebuild, sites, cost_model, None, res.best_cost),
                        time.perf_counter() - t0, _search_note(res) + " (on the sketch)"))
    t0 = time.perf_counter()
    want = [o.type for o in outputs]
    keep = max(1, _REPLAY_TUPLES // max(sk.full_tuples, 1))
    replayed, failed = [], 0
    for outs, _ in res.alternatives:
        try:
            full = canonical(replay(outs, sk, want))
        except (NotReplayable, PlacementError):
            failed += 1
            continue
        if full not in replayed:
            replayed.append(full)
            if len(replayed) >= keep:
                break
    if not replayed:
        return None
    costed = sorted(((c, plan_cost(c, cost_model, works=works)) for c in replayed), key=lambda oc: obj(oc[1]))
    best, best_cost = costed[0]
    limit = obj.memory_limit
    if limit is not None and float(best_cost.peak_bytes_per_site.max()) > limit:
        return None  # peaks do not scale with the block count: let the full search find one that fits
    sk.report = {"factor": sk.factor, "tuples": sk.tuples, "full_tuples": sk.full_tuples,
                 "replayed": len(replayed), "not_replayable": failed}
    stages.append(Stage("replay", _plan(best, lambda rs: rs[0] if len(rs) == 1 else tuple(rs), sites, cost_model,
                                        expr, best_cost),
                        time.perf_counter() - t0,
                        f"{len(replayed)} best sketch plans rebuilt at full size and costed exactly"
                        + (f"; {failed} had no full-size counterpart" if failed else "")))
    return SearchResult(best, best_cost, costed, res.truncated, res.rewrites, res.candidates, obj, sk.report)


def _check(res: SearchResult, outputs, obj) -> None:
    for i, (o, rel) in enumerate(zip(res.best, outputs)):
        if o.type != rel.type or o.layout.partial:  # the search and replay guarantee it: a bug if not
            raise AssertionError(f"the optimized plan's output {i} is not the relation {rel.label}")
    limit = obj.memory_limit
    if limit is not None and float(res.best_cost.peak_bytes_per_site.max()) > limit:
        # the objective ranks plans over the limit by their peak, so the best is the smallest
        smallest = float(res.best_cost.peak_bytes_per_site.max())
        raise NoPlanFits(
            f"no plan fits in {limit:,.0f} bytes per site: the smallest peak among the "
            f"{len(res.alternatives)} plans considered is {smallest:,.0f} bytes per site; use more "
            f"sites, smaller chunks, or a larger memory limit"
        )
