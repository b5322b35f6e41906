"""tra_dask: the tensor relational algebra (Yuan et al., PVLDB 2021) on Dask.

Public API only; see README.md for the tour.
"""

from . import keys, kernels, programs
from .kernels import Kernel, kernel
from .keys import k, k0, k1, k2, k3
from .logical import (
    Relation,
    aggregate,
    concat,
    evaluate,
    filter,
    from_chunks,
    from_function,
    from_numpy,
    join,
    rekey,
    tile,
    to_numpy,
    transform,
)
from .optimizer import ClusterSpec, Plan, compile, optimize
from .physical import All, KeySites, Part, simulate
from .types import ArrayType, RelationType

__version__ = "0.1.0"

_RUNTIME = ("submit", "compute", "plan_for", "from_dask_array", "RelationFutures")
_CALIBRATE = ("calibrate", "cluster_spec")


def __getattr__(name):
    # the runtime imports distributed; load it on first use so `import tra_dask` stays light
    if name in _RUNTIME:
        from . import runtime

        return getattr(runtime, name)
    if name in _CALIBRATE:
        import importlib

        return getattr(importlib.import_module(".calibration", __name__), name)
    raise AttributeError(f"module 'tra_dask' has no attribute {name!r}")

__all__ = [
    "Relation", "Kernel", "kernel", "ArrayType", "RelationType",
    "from_numpy", "from_chunks", "from_function",
    "aggregate", "join", "rekey", "filter", "transform", "tile", "concat",
    "evaluate", "to_numpy", "compile", "optimize", "simulate", "submit", "compute", "plan_for", "from_dask_array", "RelationFutures", "Plan", "All", "Part", "KeySites",
    "ClusterSpec", "calibrate", "cluster_spec",
    "keys", "kernels", "programs", "k", "k0", "k1", "k2", "k3",
]
