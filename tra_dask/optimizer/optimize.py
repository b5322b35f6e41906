"""``td.optimize``: the paper's initial plan, then the cheapest equivalent plan."""

from __future__ import annotations

from .compile import compile
from .cost import COST_MODELS
from .objective import as_objective
from .plan import Plan
from .rules import RULES
from .search import search

__all__ = ["optimize"]


def optimize(expr, sites: int, cost_model: str = "exact", memory_limit=None, placements=None,
             *, objective=None, budget: int = 50_000, beam: int = 6, rules=RULES) -> Plan:
    """Compile ``expr`` for ``sites`` sites and search for the cheapest equivalent plan.

    ``objective`` says what cheapest means: ``"bytes"`` (the default,
    :class:`~tra_dask.optimizer.objective.FewestBytes`: peak bytes per site within
    ``memory_limit``, then the fewest floats moved under ``cost_model``, with
    balance, tasks and tuples as tie-breakers) or any
    :class:`~tra_dask.optimizer.objective.Objective`.  ``memory_limit`` is bytes per
    site, a number or a size string like ``"1GB"``.  ``beam``: placements kept per
    plan node; ``budget``: rewrites tried before the search stops early.

    The returned Plan has ``.alternatives`` (the other plans considered, cheapest
    first, each with its ``.cost``), ``.compiled`` (the initial plan) and ``.search``
    (budget used, whether it was cut short).
    """
    if cost_model not in COST_MODELS:
        raise ValueError(f"unknown cost_model {cost_model!r}; valid: {', '.join(COST_MODELS)}")
    obj = as_objective(objective, memory_limit)
    compiled = compile(expr, sites, placements=placements, cost_model=cost_model)
    res = search(list(compiled.outputs), rules, model=cost_model, objective=obj, budget=budget, beam=beam)
    limit = obj.memory_limit
    if limit is not None and float(res.best_cost.peak_bytes_per_site.max()) > limit:
        # the objective ranks plans over the limit by their peak, so the best is the smallest
        smallest = float(res.best_cost.peak_bytes_per_site.max())
        raise ValueError(
            f"no plan fits in {limit:,.0f} bytes per site: the smallest peak among the "
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
