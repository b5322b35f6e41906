"""Cost-based search over equivalent IA plans.

One signature: ``search(outputs, rules, model, memory_limit, budget, beam)``.

Strategy: bottom-up over the compiled plan, with memoisation per node.  For each
node (children first) the candidates are the node rebuilt over every combination of
its children's surviving candidates, closed under the rules applied at the node and
one level below (structural deduplication: equal plans are one plan), plus, for a
source whose placement is free, every balanced ``Part((d,))`` placement.  Each
candidate is costed exactly (its whole subtree, with demand) and the candidates are
pruned to a beam: the cheapest few, keeping the best of each distinct output layout
so that a plan that is dearer here but placed better for the consumer survives.  A
DAG is handled as a tree whose shared subexpressions are rebuilt identically
(structural equality re-merges them) and is costed exactly as a DAG at the end; the
outputs' candidates are combined and the cheapest combination wins.

Every rewritten plan a rule yields costs one unit of ``budget``; when it runs out the search stops
expanding, says so (``truncated``) and returns the best plan found.  It always
terminates: the closure per node is bounded in rounds and by the budget.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np

from ..node import toposort
from ..physical import Part, PNode, PSource
from .cost import Cost, plan_cost

__all__ = ["search", "SearchResult", "objective"]


@dataclass
class SearchResult:
    best: list                   # one PNode per output
    best_cost: Cost
    alternatives: list = field(default_factory=list)  # [(outputs, Cost)], cheapest first
    truncated: bool = False
    rewrites: int = 0
    candidates: int = 0


def objective(cost: Cost, memory_limit: float | None) -> tuple:
    """Lexicographic: fits in memory, balanced work (busiest site ≤ 1.25× the
    mean), fewest floats moved, least work on the busiest site, fewest tasks, fewest
    physical tuples."""
    over = memory_limit is not None and float(cost.peak_bytes_per_site.max()) > memory_limit
    unbalanced = cost.flops_balance > 1.25
    return (over, unbalanced, cost.floats_moved, float(cost.flops_per_site.max()), cost.tasks, cost.tuples)


def _signature(node: PNode) -> bytes:
    lay = node.layout
    order = np.lexsort((lay.sites, lay.rows))
    return lay.rows[order].tobytes() + lay.sites[order].tobytes() + bytes([lay.partial])


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


def _rewrites(node: PNode, rules, budget: _Budget, depth: int):
    """Rules applied at ``node`` and, to ``depth`` levels, at its descendants; each
    plan a rule yields costs one unit of budget."""
    for rule in rules:
        for alt in rule(node):
            if not budget.take():
                return
            yield alt
    if depth <= 0:
        return
    for i, child in enumerate(node.children):
        if isinstance(child, PSource):
            continue
        for alt in _rewrites(child, rules, budget, depth - 1):
            kids = list(node.children)
            kids[i] = alt
            try:
                yield _with_children(node, kids)
            except (ValueError, TypeError):
                continue


def _source_candidates(node: PSource) -> list[PNode]:
    out = [node]
    if node.free:
        for d in range(node.type.arity):
            p = Part((d,), node.nsites)
            if p != node.placement_:
                out.append(PSource(node.source, p, free=True))
    return out


def search(outputs, rules, *, model: str = "exact", memory_limit: float | None = None,
           budget: int = 50_000, beam: int = 2, rounds: int = 3) -> SearchResult:
    """The cheapest plan equivalent to ``outputs`` (compiled IA nodes) under ``rules``."""
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"the search budget must be a positive int (rewrites to try), got {budget!r}")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam!r}")
    b = _Budget(budget)
    alts: dict = {}
    costs: dict = {}
    ranked_all: dict = {}
    ncand = 0

    def score(n):
        if n not in costs:
            costs[n] = plan_cost([n], model)
        return objective(costs[n], memory_limit)

    for node in toposort(outputs):
        if isinstance(node, PSource):
            alts[node] = _source_candidates(node)
            continue
        seen: dict = {}
        partial = node.layout.partial
        for combo in itertools.product(*(alts[c] for c in node.children)):
            try:
                cand = _with_children(node, combo)
            except (ValueError, TypeError):
                continue
            if cand.layout.partial == partial:  # over a differently placed child, a fold may be partial
                seen.setdefault(cand, cand)
        frontier = list(seen)
        for _ in range(rounds):
            new = []
            for cand in frontier:
                for alt in _rewrites(cand, rules, b, depth=1):
                    if alt.layout.partial != partial:
                        continue  # a partial fold is not the same relation as a finished one
                    if alt.type != node.type:  # a rule may only yield the same relation
                        raise AssertionError(f"a rule changed the relation: {node!r} -> {alt!r}")
                    if alt not in seen:
                        seen[alt] = alt
                        new.append(alt)
            if not new or b.truncated:
                break
            frontier = new
        cands = list(seen)
        ncand += len(cands)
        ranked = sorted(cands, key=score)
        ranked_all[node] = ranked
        kept, sigs = [], set()
        for c in ranked:  # best per distinct output layout, cheapest first
            s = _signature(c)
            if s not in sigs:
                sigs.add(s)
                kept.append(c)
        chosen = kept[:beam]
        # fill the beam with the next best plans even if laid out alike: a plan that ties
        # here may be the one a rule above can improve (a filter pushed into a join)
        chosen += [c for c in ranked if c not in chosen][: max(0, beam - len(chosen))]
        original = _signature(node)  # keep a candidate laid out like the compiled node:
        if all(_signature(c) != original for c in chosen):  # its consumers were built for it
            chosen += [c for c in kept if _signature(c) == original][:1]
        alts[node] = chosen
    combos = []
    if len(outputs) == 1:  # every candidate considered for the result is an alternative
        o = outputs[0]
        combos = [([c], costs[c]) if c in costs else ([c], plan_cost([c], model)) for c in ranked_all.get(o, alts[o])]
    else:
        for combo in itertools.islice(itertools.product(*(alts[o] for o in outputs)), 256):
            combos.append((list(combo), plan_cost(list(combo), model)))
    combos.sort(key=lambda oc: objective(oc[1], memory_limit))
    best, best_cost = combos[0]
    return SearchResult(best, best_cost, combos, b.truncated, b.used, ncand)

