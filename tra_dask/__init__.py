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
from .optimizer import ClusterSpec, GpuSpec, Plan, compile, optimize
from .physical import All, KeySites, Part, simulate
from .types import ArrayType, RelationType

__version__ = "0.1.0"

_RUNTIME = ("plan_for", "from_dask_array", "RelationFutures", "ArrayFutures", "drop_scattered", "embedded_client")


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
        from .frontend.run import evaluate_local

        return evaluate_local(x)
    return kernels.to_host(_relation_to_numpy(x, chunks))


def evaluate(expr, *, check: bool = True):
    """The reference evaluator, in this process: ``{key: chunk}`` for a TRA
    expression (a tuple/dict of them gives a tuple/dict), or, for a :class:`td.Array`
    (or a tuple of them), the assembled array in its chunks' own array module — a
    cupy array for cupy chunks, with no copy to the host (:func:`to_numpy` gives
    numpy).  ``check``: the outputs' integrity, as :func:`tra_dask.logical.evaluate`."""
    if _arrays(expr):
        from .frontend.run import evaluate_local

        return evaluate_local(expr, host=False)
    return _evaluate_relation(expr, check=check)


def submit(x, client=None, sites=None, *, check: bool = True, **kw):
    """Run a TRA expression, a Plan or a :class:`td.Array` on a Dask cluster (see
    :func:`tra_dask.runtime.submit`); futures back.  With ``check`` (the default),
    every output must satisfy the integrity constraints, as for :func:`evaluate`
    (checked on the exact types, before planning)."""
    if _arrays(x):
        from .frontend.run import submit as _submit_array

        return _submit_array(x, client, sites, **kw)
    if check:
        check_outputs(x)
    from . import runtime

    return runtime.submit(x, client, sites, **kw)


def compute(x, client=None, sites=None, *, check: bool = True, **kw):
    """Run and gather: a numpy array for a :class:`td.Array`, ``{key: chunk}`` for a
    relation (see :func:`tra_dask.runtime.compute`); a tuple of arrays runs as one
    plan.  ``check`` as for :func:`submit`."""
    if _arrays(x):
        from .frontend.run import compute as _compute_array

        return _compute_array(x, client, sites, **kw)
    if check:
        check_outputs(x)
    from . import runtime

    return runtime.compute(x, client, sites, **kw)

_CALIBRATE = ("calibrate", "cluster_spec", "set_cluster_spec")


def __getattr__(name):
    # the runtime imports distributed; load it on first use so `import tra_dask` stays light
    if name in _RUNTIME:
        from . import runtime

        return getattr(runtime, name)
    if name in _CALIBRATE:
        import importlib

        return getattr(importlib.import_module(".runtime.calibrate", __name__), name)
    raise AttributeError(f"module 'tra_dask' has no attribute {name!r}")

__all__ = [
    "Array", "einsum", "matmul", "tensordot", "dot", "vdot", "outer", "from_array", "from_region", "asarray",
    "where", "concatenate", "stack", "reshape", "expand_dims", "squeeze", "var", "std", "softmax", "cov",
    "Relation", "Kernel", "kernel", "ArrayType", "RelationType",
    "from_numpy", "from_chunks", "from_function",
    "aggregate", "join", "rekey", "filter", "transform", "tile", "concat",
    "evaluate", "to_numpy", "compile", "optimize", "simulate", "submit", "compute", "plan_for", "from_dask_array", "RelationFutures", "ArrayFutures", "drop_scattered", "embedded_client", "Plan", "All", "Part", "KeySites",
    "ClusterSpec", "GpuSpec", "calibrate", "cluster_spec", "set_cluster_spec",
    "keys", "kernels", "programs", "k", "k0", "k1", "k2", "k3",
]
