"""``td.optimize``: the paper's initial plan, then the cheapest equivalent plan."""

from __future__ import annotations

from .compile import compile
from .plan import Plan
from .rules import RULES
from .search import objective, search

__all__ = ["optimize"]


def optimize(expr, sites: int, cost_model: str = "exact", memory_limit: float | None = None, placements=None,
             *, budget: int = 50_000, beam: int = 2, rules=RULES) -> Plan:
    """Compile ``expr`` for ``sites`` sites and search for the cheapest equivalent plan.

    Cheapest means: peak bytes per site within ``memory_limit`` (when given), work
    balanced across sites (busiest ≤ 1.25× the mean where the tuples allow), then the
    fewest floats moved under ``cost_model``.  The returned Plan has ``.alternatives``
    (the other plans considered, cheapest first, each with its ``.cost``),
    ``.compiled`` (the initial plan) and ``.search`` (budget used, whether it was cut
    short).
    """
    if memory_limit is not None and memory_limit <= 0:
        raise ValueError(f"memory_limit must be a positive number of bytes per site, got {memory_limit!r}")
    compiled = compile(expr, sites, placements=placements, cost_model=cost_model)
    res = search(list(compiled.outputs), rules, model=cost_model, memory_limit=memory_limit,
                 budget=budget, beam=beam)
    if memory_limit is not None and objective(res.best_cost, memory_limit)[0]:
        smallest = min(float(c.peak_bytes_per_site.max()) for _, c in res.alternatives)
        raise ValueError(
            f"no plan fits in {memory_limit:,.0f} bytes per site: the smallest peak among the "
            f"{len(res.alternatives)} plans considered is {smallest:,.0f} bytes per site; use more "
            f"sites, smaller chunks, or a larger memory limit"
        )
    plan = Plan(res.best, compiled.rebuild, compiled.sites, cost_model, expr)
    plan._cost = res.best_cost
    plan.compiled = compiled
    plan.search = res
    plan.alternatives = [
        _with_cost(Plan(outs, compiled.rebuild, compiled.sites, cost_model, expr), cost)
        for outs, cost in res.alternatives if outs != res.best
    ]
    return plan


def _with_cost(plan: Plan, cost) -> Plan:
    plan._cost = cost
    return plan
