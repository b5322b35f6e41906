"""The array front-end: numpy-style expressions and einsum over numpy, dask and
cupy arrays and TRA relations, with the chunking chosen by the optimizer."""

from .array import Array, asarray, dot, einsum, from_array, from_region, matmul, outer, tensordot, vdot
from .functions import concatenate, cov, expand_dims, reshape, softmax, squeeze, stack, std, var, where

__all__ = ["Array", "asarray", "dot", "einsum", "from_array", "from_region", "matmul", "outer", "tensordot", "vdot",
           "where", "concatenate", "stack", "reshape", "expand_dims", "squeeze", "var", "std", "softmax", "cov"]
