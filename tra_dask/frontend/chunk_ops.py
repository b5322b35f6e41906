"""The chunk kernels the array front-end builds its TRA expressions from.

Every kernel here is a module-level function with its parameters in
``Kernel.params`` (so it pickles to the workers, and two kernels with the same
parameters are one kernel), an exact type rule and a flop count.  None of them is
opaque, and none declares an algebraic law it does not have: the optimizer's side
conditions see exactly what they see for the paper's kernels.
"""

from __future__ import annotations

import math
import string
from functools import lru_cache

import numpy as np

from ..kernels import Kernel, KernelTypeError, multiply as _mul, array_module, get_kernel, one_pass, sum_of_product

__all__ = [
    "einsum_kernel", "squeeze_kernel", "expand_kernel", "permute_kernel", "broadcast_kernel",
    "scalar_kernel", "take_kernel", "reduce_kernel", "argpair_kernel", "pairfold_kernel", "take_index_kernel",
    "BINARY_OPS", "ORDERED", "block_arange", "full_region",
]

BINARY_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
              "max": np.maximum, "min": np.minimum, "pow": np.power, "gt": np.greater,
              "ge": np.greater_equal, "lt": np.less, "le": np.less_equal}


ORDERED = frozenset({"max", "min", "gt", "ge", "lt", "le"})  # the ops that compare (no complex numbers)


def _ufunc(xp, op: str):
    return getattr(xp, BINARY_OPS[op].__name__)


# ---------------------------------------------------------------------------
# einsum on chunks

_LETTERS = string.ascii_letters


def _contiguous(xp, x):
    """A contiguous array of ``x``'s own rank (``ascontiguousarray`` makes 0-d 1-d)."""
    x = xp.asarray(x)
    return xp.ascontiguousarray(x) if x.ndim else x.copy()


def _einsum(*args):
    *chunks, sub, dtype = args
    xp = array_module(*chunks)
    if dtype is not None:  # numpy's einsum(dtype=): the operands cast (the front-end checked casting=), then summed
        chunks = [c.astype(dtype, copy=False) for c in chunks]
    return _contiguous(xp, xp.einsum(sub, *chunks, optimize=len(chunks) > 1))


def _einsum_shape(sub: str):
    ins, out = sub.split("->")
    ins = ins.split(",")

    def shape(*shapes):
        size: dict = {}
        for s, sh in zip(ins, shapes):
            if len(s) != len(sh):
                raise KernelTypeError(f"{sub}: operand {s!r} needs rank {len(s)}, got shape {sh}")
            for c, n in zip(s, sh):
                if size.setdefault(c, n) != n:
                    raise KernelTypeError(f"{sub}: index {c!r} has extents {size[c]} and {n}")
        return tuple(size[c] for c in out)

    def flops(*shapes):
        size = {c: n for s, sh in zip(ins, shapes) for c, n in zip(s, sh)}
        return (2 if len(ins) > 1 else 1) * math.prod(size.values())

    return shape, flops


def _einsum_wide(*args):
    """``_einsum`` of more than 52 indices (more than ``numpy.einsum`` takes): a pair
    whose shared indices are all summed is a ``tensordot``, anything else the
    broadcast product of the operands (each transposed to the order of first
    appearance, its diagonals taken), summed over the indices not in the output."""
    *chunks, sub, dtype = args
    xp = array_module(*chunks)
    ins, out = sub.split("->")
    ins = ins.split(",")
    if dtype is not None:
        chunks = [c.astype(dtype, copy=False) for c in chunks]
    dt = np.result_type(*[c.dtype for c in chunks])
    if (len(ins) == 2 and dt != np.bool_ and all(len(set(s)) == len(s) for s in ins)
            and not (set(ins[0]) & set(ins[1]) & set(out))):
        (xs, ys), (x, y) = ins, chunks
        shared = [c for c in xs if c in ys]
        r = xp.tensordot(x, y, axes=([xs.index(c) for c in shared], [ys.index(c) for c in shared]))
        got = [c for c in xs + ys if c not in shared]
        return _contiguous(xp, xp.transpose(r, [got.index(c) for c in out]))
    labels = list(dict.fromkeys("".join(ins)))
    acc = None
    for s, x in zip(ins, chunks):
        while len(set(s)) < len(s):  # a diagonal: numpy puts it last
            c = next(c for c in s if s.count(c) > 1)
            i = s.index(c)
            j = s.index(c, i + 1)
            x = xp.diagonal(x, axis1=i, axis2=j)
            s = s[:i] + s[i + 1:j] + s[j + 1:] + c
        order = sorted(range(len(s)), key=lambda a: labels.index(s[a]))
        x = xp.transpose(x, order)
        have = [s[a] for a in order]
        x = x.reshape([x.shape[have.index(c)] if c in have else 1 for c in labels])
        acc = x if acc is None else acc * x
    summed = tuple(a for a, c in enumerate(labels) if c not in out)
    if summed:
        acc = acc.any(axis=summed) if acc.dtype == np.bool_ else acc.sum(axis=summed, dtype=acc.dtype)
    kept = [c for c in labels if c in out]
    return _contiguous(xp, xp.transpose(acc, [kept.index(c) for c in out]))


def _as_letters(sub: str):
    """``sub`` with its indices renamed to letters in order of first appearance
    (``numpy.einsum`` takes a-z, A-Z), unchanged when they are letters, None when
    there are more than 52."""
    labels = dict.fromkeys(c for c in sub if c not in ",->")
    if all(c in _LETTERS for c in labels):
        return sub
    if len(labels) > len(_LETTERS):
        return None
    name = {c: _LETTERS[k] for k, c in enumerate(labels)}
    return "".join(name.get(c, c) for c in sub)


@lru_cache(maxsize=None)
def einsum_kernel(sub: str, dtype: str | None = None) -> Kernel:
    """``numpy.einsum(sub, *chunks, dtype=dtype)`` (BLAS through ``optimize=True``
    for pairs).  ``dtype``: compute in it (the whole einsum's result type: numpy
    sums booleans as counts once any operand is numeric, so a partial sum of two
    boolean operands must not be a logical or).  Named ``tensordot`` when two
    operands share a summed index (a matrix-product kernel for the time model),
    else ``einsum``.  Indices may be any characters (renamed to letters for
    numpy; past 52 of them, ``tensordot`` or a broadcast product)."""
    ins, out = sub.split("->")
    ins = ins.split(",")
    if not all(set(s) <= set("".join(ins)) for s in [out]):
        raise ValueError(f"einsum kernel {sub!r}: output index not in the inputs")
    shape, flops = _einsum_shape(sub)
    summed_shared = len(ins) == 2 and bool((set(ins[0]) & set(ins[1])) - set(out))
    name = "tensordot" if summed_shared else "einsum"
    rule = (lambda *d: np.result_type(*d)) if dtype is None else (lambda *d: np.dtype(dtype))
    letters = _as_letters(sub)
    return Kernel(name, _einsum if letters else _einsum_wide, len(ins), shape, dtype=rule, flops=flops,
                  params=(letters or sub, dtype))


# ---------------------------------------------------------------------------
# reshaping chunks


def _squeeze(x, axes):
    return x.reshape(tuple(n for i, n in enumerate(x.shape) if i not in axes))


def squeeze_kernel(axes: tuple) -> Kernel:
    """Drop the size-1 chunk axes ``axes``."""
    axes = tuple(sorted(axes))

    def shape(s):
        if any(a >= len(s) or s[a] != 1 for a in axes):
            raise KernelTypeError(f"squeeze{axes}: chunk {s} has no size-1 axes there")
        return tuple(n for i, n in enumerate(s) if i not in axes)

    return Kernel("squeeze", _squeeze, 1, shape, flops=lambda s: 0, params=(axes,))


def _expand(x, positions, rank):
    shape, it = [], iter(x.shape)
    for i in range(rank):
        shape.append(1 if i in positions else next(it))
    return x.reshape(tuple(shape))


def expand_kernel(positions: tuple, rank: int) -> Kernel:
    """Insert size-1 axes at ``positions`` of a chunk of rank ``rank - len(positions)``."""
    positions = tuple(sorted(positions))

    def shape(s):
        if len(s) + len(positions) != rank:
            raise KernelTypeError(f"expand{positions}: chunk rank {len(s)} + {len(positions)} != {rank}")
        out, it = [], iter(s)
        for i in range(rank):
            out.append(1 if i in positions else next(it))
        return tuple(out)

    return Kernel("expand", _expand, 1, shape, flops=lambda s: 0, params=(positions, rank))


def _permute(x, perm):
    return array_module(x).ascontiguousarray(x.transpose(perm))


def permute_kernel(perm: tuple) -> Kernel:
    """Transpose a chunk's axes by ``perm`` (``numpy.transpose``)."""
    perm = tuple(int(p) for p in perm)
    if perm == (1, 0):
        return get_kernel("transpose")

    def shape(s):
        if len(s) != len(perm):
            raise KernelTypeError(f"permute{perm}: chunk of rank {len(s)}")
        return tuple(s[p] for p in perm)

    return Kernel("permute", _permute, 1, shape, flops=lambda s: 0, params=(perm,))


def _take(x, axis, i):
    return _contiguous(array_module(x), x.take(i, axis=axis))


def take_kernel(axis: int, i: int) -> Kernel:
    """Element ``i`` along ``axis`` of a chunk (the axis goes)."""

    def shape(s):
        if axis >= len(s) or not 0 <= i < s[axis]:
            raise KernelTypeError(f"take({axis}, {i}): chunk {s}")
        return tuple(n for a, n in enumerate(s) if a != axis)

    return Kernel("take", _take, 1, shape, flops=lambda s: 0, params=(axis, i))


# ---------------------------------------------------------------------------
# elementwise


def _place(x, positions, rank):
    """``x`` reshaped to ``rank`` axes, its own axes at ``positions``, size 1 elsewhere."""
    shape = [1] * rank
    for p, n in zip(positions, x.shape):
        shape[p] = n
    return x.reshape(tuple(shape))


def _broadcast_op(a, b, op, pa, pb, rank):
    xp = array_module(a, b)
    return _ufunc(xp, op)(_place(a, pa, rank), _place(b, pb, rank))


def broadcast_kernel(op: str, pa: tuple, pb: tuple, rank: int) -> Kernel:
    """``op`` on two chunks whose axes sit at output axes ``pa`` and ``pb`` (numpy
    broadcasting over the axes either lacks)."""

    def placed(s, p):
        out = [1] * rank
        for i, n in zip(p, s):
            out[i] = n
        return tuple(out)

    def shape(sa, sb):
        if len(sa) != len(pa) or len(sb) != len(pb):
            raise KernelTypeError(f"broadcast {op}: chunk ranks {len(sa)}, {len(sb)} vs {pa}, {pb}")
        try:
            return tuple(np.broadcast_shapes(placed(sa, pa), placed(sb, pb)))
        except ValueError:
            raise KernelTypeError(f"broadcast {op}: chunks {sa} and {sb} do not broadcast") from None

    def dtype(da, db):
        if op in ORDERED and "c" in (np.dtype(da).kind, np.dtype(db).kind):
            raise KernelTypeError(f"broadcast {op}: complex numbers have no order")
        return _ufunc(np, op)(np.ones(1, da), np.ones(1, db)).dtype

    return Kernel(f"broadcast_{op}", _broadcast_op, 2, shape, dtype=dtype,
                  flops=lambda sa, sb: math.prod(shape(sa, sb)), params=(op, tuple(pa), tuple(pb), rank))


def _scalar_op(x, op, c, reflected):
    f = _ufunc(array_module(x), op)
    return f(c, x) if reflected else f(x, c)


def scalar_kernel(op: str, c, reflected: bool = False) -> Kernel:
    """``x op c`` (or ``c op x``) with a Python/numpy scalar ``c``; the dtype follows
    numpy's rules for a scalar operand."""

    def dtype(d):
        one = np.ones(1, d)
        return (_ufunc(np, op)(c, one) if reflected else _ufunc(np, op)(one, c)).dtype

    return Kernel(f"scalar_{op}", _scalar_op, 1, lambda s: s, dtype=dtype,
                  flops=lambda s: math.prod(s), params=(op, c, bool(reflected)), elementwise=True)


# ---------------------------------------------------------------------------
# reductions

_REDUCE = {"sum": "sum", "max": "max", "min": "min"}


def _reduce(x, op, axes):
    xp = array_module(x)
    return xp.asarray(getattr(xp, _REDUCE[op])(x, axis=axes))


def _sum_of_mul(a, b, op, axes):
    """``reduce_sum(mul(a, b))`` (the front-end's nearest-neighbour distance after
    R1-7) in one pass (:func:`~tra_dask.kernels.sum_of_product`), else the two kernels."""
    r = sum_of_product(a, b, axes) if op == "sum" else None
    return _reduce(_mul(a, b), op, axes) if r is None else r


one_pass(_reduce, _mul, _sum_of_mul)


def reduce_kernel(op: str, axes: tuple) -> Kernel:
    """``numpy.sum/max/min(chunk, axis=axes)``."""
    axes = tuple(sorted(axes))

    def shape(s):
        if any(a >= len(s) for a in axes):
            raise KernelTypeError(f"{op}{axes}: chunk of rank {len(s)}")
        return tuple(n for i, n in enumerate(s) if i not in axes)

    def dtype(d):
        return getattr(np, _REDUCE[op])(np.ones((1,) * max(1, len(axes)), d), axis=tuple(range(max(1, len(axes))))).dtype

    return Kernel(f"reduce_{op}", _reduce, 1, shape, dtype=dtype, flops=lambda s: math.prod(s),
                  params=(op, axes))


class block_arange:
    """``fn(key)`` for :func:`~tra_dask.from_function`: the global indices of block
    ``key[0]`` of an axis of ``extent`` in blocks of ``block``."""

    def __init__(self, extent: int, block: int):
        self.extent, self.block = int(extent), int(block)

    def __call__(self, key):
        lo = key[0] * self.block
        return np.arange(lo, min(lo + self.block, self.extent), dtype=np.int64)

    def __eq__(self, other):
        return isinstance(other, block_arange) and (self.extent, self.block) == (other.extent, other.block)

    def __hash__(self):
        return hash(("block_arange", self.extent, self.block))


class full_region:
    """``fn(region)`` for a ``from_region`` leaf: ``value`` (a numpy scalar) over the
    region — an einsum or reduction whose result is known from shapes alone (a sum
    over an empty axis is zeros; a mean of one is NaN), made where the plan puts it."""

    def __init__(self, value):
        self.value = value

    def __call__(self, region):
        return np.full(tuple(s.stop - s.start for s in region), self.value, dtype=self.value.dtype)

    def __eq__(self, other):
        return (isinstance(other, full_region) and self.value.dtype == other.value.dtype
                and self.value.tobytes() == other.value.tobytes())

    def __hash__(self):
        return hash(("full_region", str(self.value.dtype), self.value.tobytes()))

    def __repr__(self):
        return f"full({self.value!r})"


def _pair_dtype(d):
    d = np.dtype(d)
    return np.dtype(np.float64) if d.kind in "fc" or d.itemsize > 8 else np.dtype(np.int64)


def _argpair(x, idx, op, axis):
    """``[best value, its global index]`` along ``axis`` of a chunk, stacked as axis 0."""
    xp = array_module(x, idx)
    pos = (xp.argmin if op == "min" else xp.argmax)(x, axis=axis)
    val = xp.take_along_axis(x, xp.expand_dims(pos, axis), axis=axis).squeeze(axis)
    dt = _pair_dtype(x.dtype)
    return xp.stack([val.astype(dt), idx[pos].astype(dt)])


def argpair_kernel(op: str, axis: int) -> Kernel:
    """Per chunk, the best (``min``/``max``) value along ``axis`` and its global index
    (from the joined index chunk)."""

    def shape(s, i):
        if axis >= len(s) or i != (s[axis],):
            raise KernelTypeError(f"arg{op} along {axis}: chunk {s} with index chunk {i}")
        return (2,) + tuple(n for j, n in enumerate(s) if j != axis)

    return Kernel(f"arg{op}_pair", _argpair, 2, shape, dtype=lambda d, i: _pair_dtype(d),
                  flops=lambda s, i: math.prod(s), params=(op, axis))


def _pairfold(a, b, op):
    xp = array_module(a, b)
    better = (a[0] < b[0]) if op == "min" else (a[0] > b[0])
    first = a[1] <= b[1]
    take_a = better | ((a[0] == b[0]) & first)
    if a.dtype.kind == "f":  # numpy: the first NaN wins
        na, nb = xp.isnan(a[0]), xp.isnan(b[0])
        take_a = xp.where(na | nb, na & (~nb | first), take_a)
    return xp.where(take_a[None], a, b)


def pairfold_kernel(op: str) -> Kernel:
    """The better of two ``[value, index]`` stacks, elementwise (ties: smaller
    index, as numpy's argmin/argmax); associative and commutative."""

    def shape(sa, sb):
        if sa != sb or not sa or sa[0] != 2:
            raise KernelTypeError(f"arg{op} fold needs equal [value, index] stacks, got {sa} and {sb}")
        return sa

    return Kernel(f"arg{op}_fold", _pairfold, 2, shape, flops=lambda sa, sb: math.prod(sa),
                  associative=True, commutative=True, params=(op,))


def _take_index(x):
    return _contiguous(array_module(x), x[1].astype(np.int64))


TAKE_INDEX = Kernel("take_index", _take_index, 1, lambda s: s[1:], dtype=lambda d: np.dtype(np.int64),
                    flops=lambda s: 0)


def take_index_kernel() -> Kernel:
    return TAKE_INDEX
