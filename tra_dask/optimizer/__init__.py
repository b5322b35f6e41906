"""Compilation TRA → IA, the cost and time models, the rules, the search."""

from .cluster import ClusterSpec, GpuSpec
from .compile import compile, default_placement
from .optimize import NoPlanFits, optimize
from .cost import COST_MODELS, Cost, NodeCost, node_cost, plan_cost
from .plan import Plan

__all__ = ["ClusterSpec", "GpuSpec", "optimize", "NoPlanFits", "compile", "default_placement", "Plan", "Cost", "NodeCost", "node_cost", "plan_cost", "COST_MODELS"]
