"""The implementation algebra (paper §4): physical nodes, placements, layouts and
the strict site simulator."""

from .demand import demand, result_copies
from .layout import Layout
from .nodes import (Broadcast, ConcatAgg, KeyArrayMap, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PNode,
                    PSource, Shuffle, TileMap)
from .placement import All, KeySites, Part, Placement, as_placement
from .simulate import SimResult, simulate

__all__ = [
    "PNode", "PSource", "Broadcast", "Shuffle", "LocalJoin", "LocalAggregate", "LocalFilter", "LocalMap",
    "KeyArrayMap", "TileMap", "ConcatAgg", "Placement", "All", "Part", "KeySites", "as_placement", "Layout",
    "simulate", "SimResult", "demand", "result_copies",
]
