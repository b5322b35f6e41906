"""tra_dask: the tensor relational algebra (Yuan et al., PVLDB 2021) on Dask.

Public API only; see README.md for the tour.
"""

import importlib

from . import keys, kernels, programs
from .kernels import Kernel, kernel
from .keys import k, k0, k1, k2, k3
from .logical import (
    Relation,
    aggregate,
    concat,
    filter,
    from_chunks,
    from_function,
    from_numpy,
    join,
    rekey,
    tile,
    transform,
)
from .logical import check_outputs
from .logical import evaluate as _evaluate_relation
from .logical import to_numpy as _relation_to_numpy
from .frontend import (Array, asarray, concatenate, cov, dot, einsum, expand_dims, from_array, from_region, matmul,
                       outer, reshape, softmax, squeeze, stack, std, tensordot, var, vdot, where)
from .frontend.run import evaluate_local as _evaluate_arrays
from .optimizer import ClusterSpec, GpuSpec, Plan, compile, optimize
from .optimizer.target import SearchOptions, Target
from .physical import All, KeySites, Part, simulate
from .types import ArrayType, RelationType

__version__ = "0.1.0"

# loaded on first use (PEP 562), so that `import tra_dask` does not import distributed:
# the name -> the module that defines it
_LAZY = {
    **dict.fromkeys(("submit", "compute"), ".api"),
    **dict.fromkeys(("plan_for", "from_dask_array", "RelationFutures", "ArrayFutures", "drop_scattered",
                     "embedded_client"), ".runtime"),
    **dict.fromkeys(("calibrate", "cluster_spec", "set_cluster_spec"), ".runtime.calibrate"),
}


def _arrays(x) -> bool:
    return isinstance(x, Array) or (isinstance(x, (tuple, list)) and bool(x) and
                                    all(isinstance(a, Array) for a in x))


def to_numpy(x, chunks=None):
    """One numpy array from a relation whose keys form a chunk grid (``chunks``: its
    evaluated chunks, else it is evaluated here), or from a :class:`td.Array` (or a
    tuple of them: evaluated in this process by the reference evaluator).  Always
    numpy: cupy chunks are copied to the host (:func:`evaluate` keeps them on the
    device)."""
    if _arrays(x):
        return _evaluate_arrays(x)
    return kernels.to_host(_relation_to_numpy(x, chunks))


def evaluate(expr, *, check: bool = True):
    """The reference evaluator, in this process: ``{key: chunk}`` for a TRA
    expression (a tuple/dict of them gives a tuple/dict), or, for a :class:`td.Array`
    (or a tuple of them), the assembled array in its chunks' own array module — a
    cupy array for cupy chunks, with no copy to the host (:func:`to_numpy` gives
    numpy).  ``check``: the outputs' integrity, as :func:`tra_dask.logical.evaluate`."""
    if _arrays(expr):
        return _evaluate_arrays(expr, host=False)
    return _evaluate_relation(expr, check=check)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'tra_dask' has no attribute {name!r}")

__all__ = [
    "Array", "einsum", "matmul", "tensordot", "dot", "vdot", "outer", "from_array", "from_region", "asarray",
    "where", "concatenate", "stack", "reshape", "expand_dims", "squeeze", "var", "std", "softmax", "cov",
    "Relation", "Kernel", "kernel", "ArrayType", "RelationType",
    "from_numpy", "from_chunks", "from_function",
    "aggregate", "join", "rekey", "filter", "transform", "tile", "concat",
    "evaluate", "to_numpy", "compile", "optimize", "simulate", "submit", "compute", "plan_for", "from_dask_array", "RelationFutures", "ArrayFutures", "drop_scattered", "embedded_client", "Plan", "All", "Part", "KeySites",
    "ClusterSpec", "GpuSpec", "Target", "SearchOptions", "calibrate", "cluster_spec", "set_cluster_spec",
    "keys", "kernels", "programs", "k", "k0", "k1", "k2", "k3",
]
