"""Cost-based search over equivalent IA plans.

One signature: ``search(outputs, rules, model=..., objective=..., budget=..., beam=...)``.

Strategy: dynamic programming over the compiled plan, children first, with the
*exact layout* a plan delivers as its physical property (System R's interesting
orders, Cascades' required properties).  For each node:

1. *Candidates*: the node rebuilt over every combination of its children's kept
   candidates, closed under the rules applied at the node and one level below
   (structural deduplication: equal plans are one plan; and of candidates that
   deliver one layout at one objective key, only the first is kept and rewritten:
   they offer a consumer the same layout at the same cost — before fusion, which the
   time objective's ranking counts, and before the demand of the plan they end in, so
   this prunes as the beam does, checked against exhaustive search on small programs
   (tests/test_search.py) — and over relations of one or a few tuples most rewrites
   make such copies: a 3-operand chain of one block per operand on 2 sites had 58
   candidates at its second join, of 6 distinct layouts and keys).  Broadcast and
   Shuffle are
   the enforcers; the re-partition rules (R2-x) drop or push them, and the domain
   rules (BMM either side, CMM, RMM, pre-aggregation, free source placement) offer
   whole implementations.  A free source is offered on every ``Part(d)`` (and spread
   round the sites where no ``Part(d)`` spreads it and no join but an elementwise one
   reads it: :func:`_source_candidates`).
2. *Ranking*: each candidate is costed as the plan that delivers its whole layout —
   every physical tuple it holds is needed (a consumer reads what it is given).
   That cost is a sum of per-node costs, memoised per node, so costing a candidate
   is incremental: only the new nodes on top are computed.
3. *Pruning*: the cheapest candidate per *placement signature* is kept, for the
   ``beam`` cheapest signatures — and, for an objective with an error band (the time
   objective), the candidate that moves fewest floats, so that a plan of much less
   traffic stays among the final choices.  (The chunk choice's quick searches, which
   compare predicted seconds, keep no such candidate and rewrite a node whose
   candidates are past the beam for fewer rounds: ``SearchOptions``.)  The signature
   is the exact layout and, for a Broadcast or Shuffle, also the layout of what it
   moves: a rule above may drop the move (the consumer is already co-located with that
   input), so two moves with the same output but different inputs are different
   interesting plans.

The outputs' kept candidates are combined and costed exactly (with demand: only the
tuples the results need, what the runtime makes), and the objective picks the best;
the best is costed again without each Broadcast or Shuffle that moves no tuple the
plan needs (the first of alike candidates may carry one), kept where no worse (not
on a sketch, whose idle moves may move at full size; not on plans of over
:data:`IDLE_MOVES_TUPLES` tuples).
A shared subexpression is a node of the compiled DAG and gets one candidate list;
the consumers pick from it independently, so a result may use two placements of a
shared node (computed twice, costed twice — the exact cost of the combined plan
counts each once per distinct physical node).  When the best plan does compute one
twice (an FFNN step's forward product, read by both weight updates, planned under
each update's preferred placement: 50% more flops), its readers are planned again
over each of those candidates alone (``reshare`` rounds, highest such node first,
each round from the candidate lists the best plan so far was combined from), and the
plans that result join the ones combined before: one computation the readers adapt
to, or two, whichever the objective prefers.  Under the time objective a round is
planned only where computing the node once could save :data:`RESHARE_GAIN` of the
best plan's seconds (:func:`_once_saves` bounds it).  (``truncated`` is the first pass's:
planning again only adds plans.)

Every plan a rule yields costs one unit of ``budget``; when it runs out the search
stops expanding, says so (``truncated``) and returns the best plan found.  It always
terminates: the closure per node is bounded in rounds and by the budget.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from dataclasses import dataclass, field

import numpy as np

from ..node import canonical, toposort
from ..physical import (Broadcast, LocalAggregate, LocalJoin, LocalMap, Part, PlacementError, PNode, PSource,
                        Shuffle)
from ..physical.demand import demand
from ..physical.nodes import interned
from ..physical.work import FusedCounts
from .cost import Cost, DeliveredCosts, plan_cost
from .objective import FastestTime, FewestBytes, Objective
from .time import fusion_for, node_seconds_per_site
from .rules.domain import contraction_memo

__all__ = ["search", "SearchResult", "objective", "delivered_cost"]

# The time objective ranks a node's candidates by their cost after fusion (_Fused) when
# their subplan runs at most this many tasks: deriving a subplan's fusion costs ~25 us
# a task, and on larger subplans the tasks fusion removes weigh less against the rest
# (an FFNN step planned for 4 sites derived 3,486 subplans of 64-256 tasks: 2.8x its
# planning time; 389 of fewer than 64: +6%)
FUSED_RANK_TASKS = 64

# A plan of at most this many physical tuples is costed again without each move that
# moves nothing it needs (_idle_moves_dropped: a tie-break, not worth a larger plan's costing)
IDLE_MOVES_TUPLES = 100_000

# a shared subexpression computed twice has its readers planned again (``reshare``) only
# if computing it once could save at least this fraction of the best plan's seconds
# (_once_saves): on 3 workers sharing 2 cores an FFNN step's best plan summed one small
# partial product twice, and planning its 38 readers again doubled the search for 0.2%
RESHARE_GAIN = 0.01

_LOCAL = (LocalJoin, LocalAggregate, LocalMap)  # nodes whose tasks are local computations (work.FUSABLE_KINDS)


@dataclass
class SearchResult:
    best: list                   # one PNode per output
    best_cost: Cost
    alternatives: list = field(default_factory=list)  # [(outputs, Cost)], cheapest first
    truncated: bool = False
    rewrites: int = 0
    candidates: int = 0
    objective: object = None
    sketch: dict | None = None   # set when the search ran on a sketch (optimizer/sketch.py)
    # every node's candidates held at most ``beam`` placement signatures, so all were kept,
    # and no budget cut the search short: a search with a wider beam searches the same
    # space (the same candidates, the same costs)
    beam_unbound: bool = False
    first_pass_cost: Cost | None = None  # the best plan's before a shared node's readers were planned again


def objective(cost: Cost, memory_limit: float | None) -> tuple:
    """The default objective's key (:class:`FewestBytes`) for ``cost``."""
    return FewestBytes(memory_limit)(cost)


def _signature(node: PNode) -> bytes:
    """The placement a candidate delivers: its exact layout (which key on which
    site, partial or not) and, for a move, what it moves.  Memoised on the node."""
    sig = node.__dict__.get("_placement_signature")
    if sig is None:
        lay = node.layout
        codes = lay.rows.astype(np.int64) * lay.nsites + lay.sites
        if len(codes) > 1 and not (codes[1:] >= codes[:-1]).all():  # a broadcast's are in order already
            codes.sort()
        sig = hashlib.blake2b(codes.tobytes() + bytes([lay.partial]), digest_size=16).digest()
        if isinstance(node, (Broadcast, Shuffle)):  # what the enforcer moves matters to a rule above
            sig += _signature(node.input)
        object.__setattr__(node, "_placement_signature", sig)
    return sig


def _with_children(node: PNode, kids) -> PNode:
    if all(a is b for a, b in zip(node.children, kids)):
        return node
    return dataclasses.replace(node, **dict(zip(node._children, kids)))


class _Budget:
    def __init__(self, n):
        self.left, self.used, self.truncated = n, 0, False

    def take(self) -> bool:
        if self.left <= 0:
            self.truncated = True
            return False
        self.left -= 1
        self.used += 1
        return True


def _rewrites(node: PNode, rules, budget: _Budget, depth: int, memo: dict | None = None):
    """Rules applied at ``node`` and, to ``depth`` levels, at its descendants; each
    plan a rule yields costs one unit of budget.  ``memo`` keeps what each rule
    yielded for a node (rules are pure): the search meets one node again as a child
    of many candidates."""
    for rule in rules:
        if memo is None:
            alts = rule(node)
        else:
            alts = memo.get((rule, node))
            if alts is None:
                alts = memo[(rule, node)] = tuple(rule(node))
        for alt in alts:
            if not budget.take():
                return
            yield alt
    if depth <= 0:
        return
    for i, child in enumerate(node.children):
        if isinstance(child, PSource):
            continue
        for alt in _rewrites(child, rules, budget, depth - 1, memo):
            kids = list(node.children)
            kids[i] = alt
            try:
                yield _with_children(node, kids)
            except PlacementError:
                continue


def _source_candidates(node: PSource, joined: bool = True) -> list[PNode]:
    """A free source on each ``Part(d)`` and, for one that no join reads but an
    elementwise one (``joined`` False: its maps, aggregations and elementwise joins
    run where it is loaded, and no join strategy places it again), where none of
    those spreads its keys evenly (8x2 blocks on 16 sites: ``Part(0)`` leaves 8 sites
    empty), on ``Part`` of every key dim (row-major order dealt round the sites: no
    site holds more than one key over an even share); of placements that put every
    key where another does (a relation of one key along ``d``: every ``Part`` of a
    one-tuple relation), the first only — one layout is one candidate."""
    out = [node]
    if node.free:
        seen = {_signature(node)}
        arity, n, s = node.type.arity, node.type.ntuples, node.nsites
        parts = [Part((d,), s) for d in range(arity)]
        even = -(-n // s)
        if not joined and arity > 1 and n > 1 and min(_most_per_site(p, node.type) for p in parts) > even:
            parts.append(Part(tuple(range(arity)), s))
        for p in parts:
            if p != node.placement_:
                alt = PSource(node.source, p, free=True)
                if _signature(alt) not in seen:
                    seen.add(_signature(alt))
                    out.append(alt)
    return out


def _one_to_one(join: LocalJoin) -> bool:
    """Whether ``join`` joins on every key dim of both inputs (an elementwise join:
    co-partitioned on any placement of its keys alike)."""
    return len(join.left_on) == join.left.type.arity and len(join.right_on) == join.right.type.arity


def _most_per_site(p: Part, t) -> int:
    """The most keys of a relation of type ``t`` that ``p`` puts on one site."""
    return int(np.bincount(p.sites(t), minlength=p.nsites).max())


def delivered_cost(root: PNode, model: str = "exact") -> Cost:
    """The cost of a subplan that delivers every physical tuple of its layout (the
    search's ranking cost; :func:`~tra_dask.optimizer.cost.plan_cost` counts only
    the tuples the results need)."""
    return DeliveredCosts(model)(root)


def search(outputs, rules, *, model: str = "exact", objective: Objective | None = None,
           memory_limit: float | None = None, budget: int = 50_000, beam: int = 6, rounds: int = 3,
           final: int = 64, reshare: int = 3, bound_rounds: int | None = None,
           least_traffic: bool = True, tidy: bool = True) -> SearchResult:
    """The cheapest plan equivalent to ``outputs`` (compiled IA nodes) under ``rules``
    (see the module docstring).  ``beam``: placement signatures kept per node;
    ``rounds``: rewriting rounds of a node's closure, and ``bound_rounds`` (None:
    ``rounds``) those of a node whose candidates already hold more placement signatures
    than the beam keeps; ``final``: candidates per output costed exactly at the end;
    ``reshare``: rounds of planning a twice-computed subexpression's readers over one
    of its candidates; ``least_traffic``: under an objective with an error band, each
    node also keeps its least-traffic candidate; ``tidy``: the best plan is costed again
    without its idle moves (module doc; off for a sketch, whose idle moves may move at
    full size)."""
    outputs = canonical(list(outputs))
    bound_rounds = rounds if bound_rounds is None else bound_rounds
    with contraction_memo(), interned(toposort(outputs)):
        return _search(outputs, rules, model, objective, memory_limit, budget, beam, rounds, final, reshare,
                       bound_rounds, least_traffic, tidy)


def _search(outputs, rules, model, objective, memory_limit, budget, beam, rounds, final, reshare, bound_rounds,
            least_traffic, tidy) -> SearchResult:
    for name, v in (("budget", budget), ("beam", beam), ("rounds", rounds), ("final", final), ("reshare", reshare),
                    ("bound_rounds", bound_rounds)):
        least = 0 if name == "reshare" else 1
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise ValueError(f"the search's {name} must be an int >= {least}, got {v!r}")
    obj = objective if objective is not None else FewestBytes(memory_limit)
    traffic = least_traffic and getattr(obj, "band", 0.0) > 0  # keep each node's least-traffic candidate too
    b = _Budget(int(budget))
    bound = [False]  # whether the beam dropped a placement signature at some node
    delivered = DeliveredCosts(model)
    memo: dict = {}
    alts: dict = {}
    ranked_all: dict = {}
    ncand = 0

    scores: dict = {}  # candidate -> the objective's key of its delivered cost

    def score(n):
        k = scores.get(n)
        if k is None:
            k = scores[n] = obj(delivered(n))
        return k

    fused = _Fused(obj, delivered, score) if isinstance(obj, FastestTime) else None

    def expand(node, alts) -> tuple[list, list]:
        """``node``'s candidates over its children's kept ones, closed under the rules,
        ranked; and the kept few (module doc)."""
        seen: dict = {}
        alike: set = set()  # (placement signature, objective key) of each candidate kept

        def unlike(c) -> bool:
            """Whether no candidate kept delivers ``c``'s layout at ``c``'s key (module
            doc; then ``c`` is kept)."""
            k = (_signature(c), score(c))
            if k in alike:
                return False
            alike.add(k)
            return True

        partial = node.layout.partial
        for combo in itertools.product(*(alts[c] for c in node.children)):
            try:
                cand = _with_children(node, combo)
            except PlacementError:
                continue
            if cand.layout.partial == partial and cand not in seen and unlike(cand):
                seen[cand] = cand  # (over a differently placed child, a fold may be partial)
        frontier = list(seen)
        for r in range(rounds):
            new = []
            for cand in frontier:
                for alt in _rewrites(cand, rules, b, depth=1, memo=memo):
                    if alt.layout.partial != partial:
                        continue  # a partial fold is not the same relation as a finished one
                    if alt.type != node.type:  # a rule may only yield the same relation
                        raise AssertionError(f"a rule changed the relation: {node!r} -> {alt!r}")
                    if alt not in seen and unlike(alt):
                        seen[alt] = alt
                        new.append(alt)
            if not new or b.truncated:
                break
            if bound_rounds <= r + 1 < rounds and len({_signature(c) for c in seen}) > beam:
                break  # the beam binds here (no wider search is this one): its closure stops
            frontier = new
        ranked = sorted(seen, key=score) if fused is None else fused.rank(list(seen), beam)
        if not bound[0] and len({_signature(c) for c in ranked}) > beam:
            bound[0] = True
        kept, sigs = [], set()
        for c in ranked:  # the cheapest per placement signature, cheapest signatures first
            s = _signature(c)
            if s not in sigs:
                sigs.add(s)
                kept.append(c)
                if len(kept) == beam:
                    break
        if traffic and ranked:  # and the one that moves least (the time objective may rank it out of the beam,
            # and it is what a near-tie should go to: optimize.less_traffic)
            least = min(delivered(c).floats_moved for c in ranked)
            low = min((c for c in ranked if delivered(c).floats_moved == least), key=score)
            if _signature(low) not in sigs:
                sigs.add(_signature(low))
                kept.append(low)
        original = _signature(node)  # keep a candidate laid out like the compiled node:
        if all(_signature(c) != original for c in kept):  # its consumers were built for it
            kept += [c for c in ranked if _signature(c) == original][:1]
        return ranked, kept

    def combined(alts, ranked_all) -> list:
        """The outputs' kept candidates combined (a single output's ranked ones), costed
        exactly: each distinct physical node once."""
        if len(outputs) == 1:  # the output's candidates are the alternatives
            o = outputs[0]
            combos = [[c] for c in ranked_all.get(o, alts[o])[:final]]
        else:
            combos = [list(c) for c in itertools.islice(itertools.product(*(alts[o] for o in outputs)), final)]
        combos = [canonical(c) for c in combos]  # shared nodes one object, as the Plan will hold them
        return [(c, plan_cost(c, model)) for c in combos]

    order = toposort(outputs)
    joined: set = set()  # the nodes below a join other than one that pairs keys one to one
    for n in reversed(order):
        if n in joined or isinstance(n, LocalJoin) and not _one_to_one(n):
            joined.update(n.children)
    for node in order:
        if isinstance(node, PSource):
            alts[node] = sorted(_source_candidates(node, node in joined), key=score)
            continue
        ranked, alts[node] = expand(node, alts)
        ncand += len(ranked)
        ranked_all[node] = ranked
    costed = combined(alts, ranked_all)
    made_from = {tuple(c): (alts, ranked_all) for c, _ in costed}  # the candidate lists each plan combines
    costed.sort(key=lambda oc: obj(oc[1]))

    done: dict = {}

    def tidied(plan, cost) -> tuple:  # a plan without its idle moves (each plan tidied once)
        if not tidy:
            return plan, cost
        got = done.get(tuple(plan))
        if got is None:
            got = done[tuple(plan)] = _idle_moves_dropped(plan, cost, obj, model)
        return got

    first = tidied(*costed[0])
    first_pass_cost = first[1]
    truncated = b.truncated  # (the first pass's: planning again only adds plans)
    tried: set = set()
    for _ in range(reshare):  # a shared subexpression computed twice: plan its readers over one of them
        base_alts, base_ranked = made_from[tuple(costed[0][0])]  # (a later round builds on the best's)
        fixed = _duplicated(costed[0][0], outputs, base_ranked, tried)
        if fixed is None or b.truncated:
            break
        shared, impls = fixed
        if fused is not None and _once_saves(costed[0], shared, base_ranked, obj) < RESHARE_GAIN * obj.seconds(
                costed[0][1]):
            break  # computing it once saves too little to plan its readers again
        above = _above(outputs, shared)
        for impl in impls:
            tried.add(impl)
            alts2, ranked2 = dict(base_alts), dict(base_ranked)
            alts2[shared], ranked2[shared] = [impl], [impl]
            for node in toposort(outputs):
                if node in above:
                    ranked2[node], alts2[node] = expand(node, alts2)
                    ncand += len(ranked2[node])
                    if not alts2[node]:  # no reader runs over this candidate where it is
                        break
            if any(not alts2[node] for node in above):
                continue
            for c, cost in combined(alts2, ranked2):
                if tuple(c) not in made_from:
                    made_from[tuple(c)] = (alts2, ranked2)
                    costed.append((c, cost))
        costed.sort(key=lambda oc: obj(oc[1]))
    # planning again only adds plans: the best tidied is never worse than the first pass's
    best, best_cost = min((tidied(*costed[0]), first), key=lambda oc: obj(oc[1]))
    if best is not costed[0][0]:
        costed.insert(0, (best, best_cost))  # (the plans it was tidied from stay among the alternatives)
    unbound = not (bound[0] or b.truncated) and all(len(ranked_all.get(o, ())) <= final for o in outputs)
    return SearchResult(best, best_cost, costed, truncated, b.used, ncand, obj, beam_unbound=unbound,
                        first_pass_cost=first_pass_cost)


def _idle_moves_dropped(outputs: list, cost: Cost, obj, model: str) -> tuple:
    """``(outputs, cost)`` with each Broadcast or Shuffle that moves no tuple the plan
    needs (under its demand) replaced by its input, where the plan stays valid (its
    readers are rebuilt, their layouts checked) and the objective's key is no worse:
    the search keeps one of a node's candidates that deliver one layout at one cost
    (``expand``), and the one kept may carry a move whose copies no reader takes — the
    same plan, with more nodes and tuples."""
    if cost.tuples > IDLE_MOVES_TUPLES:
        return outputs, cost
    key = obj(cost)
    tried: set = set()
    while True:
        need = demand(outputs)
        idle = [n for n in toposort(outputs) if isinstance(n, (Broadcast, Shuffle)) and n not in tried
                and not (n.layout.moved & need[n]).any()]
        if not idle:
            return outputs, cost
        move = idle[0]
        tried.add(move)
        try:
            trial = canonical(_replaced(outputs, move, move.input))
        except PlacementError:
            continue
        if any(a.type != b.type or a.layout.partial != b.layout.partial for a, b in zip(trial, outputs)):
            continue
        trial_cost = plan_cost(trial, model)
        if obj(trial_cost) <= key:
            outputs, cost, key = trial, trial_cost, obj(trial_cost)


def _replaced(outputs: list, old: PNode, new: PNode) -> list:
    """``outputs`` with ``old`` replaced by ``new`` wherever it is read (the readers
    rebuilt: a PlacementError where one no longer holds)."""
    made: dict = {}
    for n in toposort(outputs):  # children first, each (structurally distinct) node once: no recursion
        made[n] = new if n == old else _with_children(n, [made[c] for c in n.children])
    return [made[o] for o in outputs]


class _Fused:
    """The time objective's ranking of a node's candidates *after fusion*
    (:mod:`tra_dask.physical.work` fuses a subplan's local chains after placement,
    removing tasks and nothing else): each candidate's key is its delivered cost with
    the tasks fusion removes from the subplan it roots.  Deriving a subplan's fusion
    (:class:`~tra_dask.physical.work.FusedCounts`, from its children's subplans) is
    still the dearest part of a key, so it is done by branch and bound: a candidate's seconds with every
    one of its fusable tasks fused (its local computations' tasks below the root) bound
    its fused seconds from below, and candidates are fused in the order of that bound
    until it passes the ``beam``-th best placement signature's fused key, each one only
    if its bound is below its own signature's best fused key so far (those not fused
    follow the fused ones, in the order of their bound: none of them is the best of a
    signature the search keeps).  A subplan of more than :data:`FUSED_RANK_TASKS`
    tasks is ranked unfused (its fusion is derived only if it is in a final plan:
    ``optimize.fastest_fused``)."""

    def __init__(self, obj, delivered, score):
        self.obj, self.delivered, self.score = obj, delivered, score
        self.fusion: dict = {}
        self.keys: dict = {}
        self.works: dict = {}  # node works shared by the subplans counted (physical.work.FusedCounts)

    def key(self, c) -> tuple:
        k = self.keys.get(c)
        if k is None:
            cost = self.delivered(c)
            if cost.tasks > FUSED_RANK_TASKS or not fusable_tasks([c], cost):  # (nothing to fuse: its own key)
                k = self.keys[c] = self.score(c)
                return k
            spec = self.obj.spec(cost.sites)
            fusion = self.fusion.get(cost.sites)
            if fusion is None:
                fusion = self.fusion[cost.sites] = FusedCounts(fusion_for(spec), self.works)
            k = self.keys[c] = self.obj(cost.with_fused(fusion(c)))
        return k

    def bound(self, c) -> tuple:
        cost = self.delivered(c)
        k = self.score(c)
        if cost.tasks > FUSED_RANK_TASKS:
            return k[:3]
        return (k[0], k[1], k[2] - self.obj.spec(cost.sites).task_overhead * fusable_tasks([c], cost))

    def rank(self, cands: list, beam: int) -> list:
        bounded = sorted(((self.bound(c), i) for i, c in enumerate(cands)), key=lambda x: x)
        best: dict = {}  # placement signature -> its best fused key
        done, rest = [], []
        for n, (b, i) in enumerate(bounded):
            if len(best) >= beam and b > sorted(best.values())[beam - 1][:3]:
                rest += [cands[j] for _, j in bounded[n:]]
                break
            c = cands[i]
            sig = _signature(c)
            if sig in best and b > best[sig][:3]:
                rest.append(c)  # not the best of its signature
                continue
            k = self.key(c)
            done.append((k, i, c))
            if sig not in best or k < best[sig]:
                best[sig] = k
        return [c for _, _, c in sorted(done, key=lambda x: x[:2])] + rest


def fusable_tasks(roots, cost: Cost) -> int:
    """At least as many tasks as fusion can remove from the (sub)plan of ``roots``
    (costed ``cost``, unfused): those of its local computations (joins, aggregations,
    maps) that are not roots — :mod:`tra_dask.physical.work` fuses only such a task,
    and only into a reader."""
    roots = set(roots)
    return sum(nc.tasks for node, nc in cost.nodes.items() if isinstance(node, _LOCAL) and node not in roots)


def _duplicated(plan_outputs, outputs, ranked_all, tried):
    """A subexpression of the compiled plan ``outputs`` that the plan ``plan_outputs``
    computes more than once (two or more of its candidates are in the plan, neither
    inside the other: a Broadcast's candidates include its input where the move is
    dropped), the highest such with a candidate not tried before, and those
    candidates; None if there is none."""
    nodes = set(toposort(plan_outputs))
    for compiled in reversed(toposort(outputs)):
        if isinstance(compiled, PSource) or compiled not in ranked_all:
            continue
        impls = [c for c in ranked_all[compiled] if c in nodes]
        if len(impls) > 1:
            inside = [set(toposort(c.children)) for c in impls]
            impls = [c for c in impls if not any(c in below for below in inside)]
        if len(impls) > 1:
            fresh = [c for c in impls if c not in tried]
            if fresh:
                return compiled, fresh
    return None


def _once_saves(plan, compiled, ranked_all, obj) -> float:
    """At most the seconds the plan ``(outputs, cost)`` saves under the time objective
    ``obj`` by computing the shared ``compiled`` node once: the work of the subplans of
    all its candidates in the plan but the one kept, beyond the kept one's — each
    node's seconds summed over its sites and its tasks' overheads, which bound what
    removing it takes off the critical path, the busiest site's total and the tasks'
    overhead (a makespan term is at most the sum of its nodes' site-seconds)."""
    outs, cost = plan
    nodes = set(toposort(outs))
    impls = [c for c in ranked_all[compiled] if c in nodes]
    subs = [set(toposort([c])) for c in impls]
    spec = obj.spec(cost.sites)

    def work(n) -> float:
        nc = cost.nodes.get(n)
        return 0.0 if nc is None else float(node_seconds_per_site(nc, spec).sum()) + nc.tasks * spec.task_overhead

    best = 0.0
    for i, kept in enumerate(subs):
        dropped = set().union(*(sub for j, sub in enumerate(subs) if j != i)) - kept
        best = max(best, sum(work(n) for n in dropped))
    return best


def _above(outputs, node) -> set:
    """The nodes of ``outputs``'s DAG that read ``node``, directly or not."""
    above: set = set()
    for n in toposort(outputs):
        if any(c is node or c in above for c in n.children):
            above.add(n)
    return above
