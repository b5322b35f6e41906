"""The implementation algebra (paper §4): physical nodes, placements, layouts and
the strict site simulator."""

from .demand import demand, result_copies
from .layout import Layout, PlacementError
from .nodes import (Broadcast, ConcatAgg, KeyArrayMap, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PNode,
                    PSource, Shuffle, TileMap)
from .placement import All, Assign, Grid, KeySites, Part, Placement, affinity_table, as_placement, blocked_table
from .simulate import SimResult, simulate
from .work import NodeWork, PlanWork, Task, Transfer, node_work, plan_work

__all__ = [
    "PNode", "PSource", "Broadcast", "Shuffle", "LocalJoin", "LocalAggregate", "LocalFilter", "LocalMap",
    "KeyArrayMap", "TileMap", "ConcatAgg", "Placement", "All", "Part", "Grid", "KeySites", "Assign", "affinity_table", "blocked_table", "as_placement", "Layout", "PlacementError",
    "simulate", "SimResult", "demand", "result_copies",
    "NodeWork", "PlanWork", "Task", "Transfer", "node_work", "plan_work",
]
