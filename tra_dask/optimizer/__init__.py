"""Compilation TRA → IA and the cost model (the rules and the search arrive next)."""

from .compile import compile, default_placement
from .optimize import optimize
from .cost import COST_MODELS, Cost, NodeCost, node_cost, plan_cost
from .plan import Plan

__all__ = ["optimize", "compile", "default_placement", "Plan", "Cost", "NodeCost", "node_cost", "plan_cost", "COST_MODELS"]
