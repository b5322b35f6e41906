"""The logical layer: TRA expression nodes, sources, builders and the reference
evaluator (paper §3)."""

from .builders import aggregate, concat, filter, from_chunks, from_function, from_numpy, join, rekey, tile, transform
from .evaluate import check_integrity, check_outputs, evaluate, flatten_outputs, on_device, substitute, to_numpy
from .nodes import Aggregate, Concat, Filter, Join, Rekey, Relation, Tile, Transform, toposort
from .sources import ClusterSource, FromChunks, FromFunction, FromNumpy, Pieces, Progression, Source, piece_table

__all__ = [
    "Relation", "Source", "ClusterSource", "FromNumpy", "FromChunks", "FromFunction", "Pieces", "Progression", "piece_table",
    "Aggregate", "Join", "Rekey", "Filter", "Transform", "Tile", "Concat",
    "from_numpy", "from_chunks", "from_function",
    "aggregate", "join", "rekey", "filter", "transform", "tile", "concat",
    "evaluate", "to_numpy", "on_device", "check_integrity", "check_outputs", "flatten_outputs", "substitute", "toposort",
]
