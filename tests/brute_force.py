"""A brute-force enumerator of the optimizer's plan space (test-only).

Starting from the compiled plan, apply every rule at every position of the plan
(a shared node is rewritten everywhere it occurs) and every placement of every free
source, to a fixed point, with structural deduplication.  No pruning, no cost: the
whole space the rules reach.  Tests compare its cheapest plan with the search's."""

from __future__ import annotations

import dataclasses

from tra_dask.node import toposort
from tra_dask.physical import Part, PlacementError, PSource


class SpaceTooLarge(RuntimeError):
    pass


def _replace(outputs, old, new):
    memo = {old: new}

    def go(n):
        if n in memo:
            return memo[n]
        kids = [go(c) for c in n.children]
        out = n if all(a is b for a, b in zip(kids, n.children)) else dataclasses.replace(
            n, **dict(zip(n._children, kids)))
        memo[n] = out
        return out

    return tuple(go(o) for o in outputs)


def _local_alternatives(node, rules):
    if isinstance(node, PSource):
        if node.free:
            for d in range(node.type.arity):
                p = Part((d,), node.nsites)
                if p != node.placement_:
                    yield PSource(node.source, p, free=True)
        return
    for rule in rules:
        yield from rule(node)


def enumerate_plans(outputs, rules, limit: int = 5000) -> list:
    """Every plan (a tuple of output nodes) the rules reach from ``outputs``."""
    start = tuple(outputs)
    seen = {start: None}
    todo = [start]
    while todo:
        plan = todo.pop()
        for node in toposort(plan):
            for alt in _local_alternatives(node, rules):
                if alt.layout.partial != node.layout.partial:
                    continue
                try:
                    new = _replace(plan, node, alt)
                except PlacementError:
                    continue
                if any(o.layout.partial for o in new) or new in seen:
                    continue
                seen[new] = None
                todo.append(new)
                if len(seen) > limit:
                    raise SpaceTooLarge(f"more than {limit} plans")
    return list(seen)


def enumerate_dp_space(outputs, rules, rounds: int = 3, limit: int = 20_000) -> list:
    """Every plan of the search's own space, unpruned: per node, the node over every
    combination of its children's plans, closed under the rules as the search closes
    it — but keeping *every* candidate (no placement signatures, no beam, no ranking)
    — then every combination of the outputs' candidates."""
    import itertools

    from tra_dask.optimizer.search import _Budget, _rewrites, _source_candidates, _with_children

    alts: dict = {}
    for node in toposort(outputs):
        if isinstance(node, PSource):
            alts[node] = _source_candidates(node)
            continue
        seen: dict = {}
        for combo in itertools.product(*(alts[c] for c in node.children)):
            try:
                cand = _with_children(node, combo)
            except PlacementError:
                continue
            if cand.layout.partial == node.layout.partial:
                seen.setdefault(cand, cand)
        frontier = list(seen)
        for _ in range(rounds):
            new = []
            for cand in frontier:
                for alt in _rewrites(cand, rules, _Budget(10**9), depth=1):
                    if alt.layout.partial == node.layout.partial and alt not in seen:
                        seen[alt] = alt
                        new.append(alt)
            if not new:
                break
            frontier = new
        alts[node] = list(seen)
        if len(seen) > limit:
            raise SpaceTooLarge(f"{len(seen)} candidates for one node")
    combos = itertools.product(*(alts[o] for o in outputs))
    out = []
    for c in combos:
        out.append(tuple(c))
        if len(out) > limit:
            raise SpaceTooLarge(f"more than {limit} plans")
    return out
