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
    "BINARY_OPS", "ORDERED", "UNARY_UFUNCS", "ufunc_kernel", "astype_kernel", "reshape_kernel", "concat_kernel", "slice_kernel", "piece_kernel",
    "where_pack_kernel", "where_pick_kernel", "cumsum_kernel", "add_prefix_kernel", "SECOND", "block_arange", "full_region",
]

BINARY_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
              "max": np.maximum, "min": np.minimum, "pow": np.power, "gt": np.greater,
              "ge": np.greater_equal, "lt": np.less, "le": np.less_equal, "eq": np.equal, "ne": np.not_equal}
# numpy's other binary ufuncs, under their own names (a chunk kernel calls the same ufunc of cupy)
BINARY_OPS.update({n: getattr(np, n) for n in (
    "floor_divide", "remainder", "fmod", "arctan2", "hypot", "copysign", "logaddexp", "logaddexp2", "nextafter",
    "fmax", "fmin", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "logical_and",
    "logical_or", "logical_xor")})

ORDERED = frozenset({"max", "min", "gt", "ge", "lt", "le", "fmax", "fmin"})  # compare (no complex numbers)

# numpy's unary elementwise ufuncs that have no registered kernel of their own (those
# are exp, log, sqrt, tanh, abs, neg, conj: they carry algebraic laws these do not)
UNARY_UFUNCS = {n: getattr(np, n) for n in (
    "sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "arcsinh", "arccosh", "arctanh",
    "expm1", "exp2", "log1p", "log2", "log10", "square", "cbrt", "reciprocal", "sign", "floor", "ceil", "trunc",
    "rint", "positive", "isnan", "isinf", "isfinite", "signbit", "logical_not", "invert", "deg2rad", "rad2deg")}


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
    form = _matmul_form(sub) if len(chunks) == 2 else None
    if form is not None and all(c.dtype in _BLAS_TYPES for c in chunks):
        got = form(xp, *chunks)
        if got is not None:
            return got
    return _contiguous(xp, xp.einsum(sub, *chunks, optimize=len(chunks) > 1))


_BLAS_TYPES = tuple(np.dtype(t) for t in ("float32", "float64", "complex64", "complex128"))  # (others: einsum)

# A GEMM whose two free sides are each smaller than this stays with numpy.einsum: on
# small products a stack of BLAS calls is no faster than einsum's own loops (numpy
# 2.4 here: m = n = 4, k = 64 ran 0.7x einsum's speed; from 8 on, 1.0-2.0x).
MATMUL_MIN_SIDE = 8


@lru_cache(maxsize=4096)
def _matmul_form(sub: str):
    """The pair einsum ``sub`` as one broadcast ``matmul`` of views, or None.

    A GEMM (an index both operands have and the output lacks, on each side a kept
    index the other lacks) whose output ends in a run of one side's free indices,
    after a run of the other's: ``abcdef,bcdfg->abcdeg`` is a stack over ``a, b, c,
    d`` of ``(e, f) @ (f, g)`` (``a`` a broadcast axis of the second operand).  Each
    operand is transposed to (its batch axes in the output's order, its free run,
    the summed indices) and reshaped; the product reshapes to the output's order
    with no copy.  numpy.einsum runs such a contraction with batch indices in its own
    loops, 1.2-3.3x slower than BLAS here, where the time model prices a GEMM at the
    BLAS rate.  None when the subscripts are not of that form (a diagonal, an index
    summed in one operand only, no free run at the output's end): numpy.einsum."""
    ins, out = sub.split("->")
    if "." in sub or len(ins.split(",")) != 2:
        return None
    xs, ys = ins.split(",")
    if len(set(xs)) < len(xs) or len(set(ys)) < len(ys) or len(set(out)) < len(out):
        return None
    summed = [c for c in xs if c in ys and c not in out]
    if not summed or any(c not in out and c not in summed for c in xs + ys):
        return None
    side = {c: (0 if c not in ys else 1 if c not in xs else None) for c in out}
    last = side[out[-1]] if out else None
    if last is None:
        return None
    n2 = len(out) - next((i for i, c in enumerate(reversed(out)) if side[c] != last), len(out))
    right_run = out[n2:]
    first = 1 - last
    n1 = n2
    while n1 > 0 and side[out[n1 - 1]] == first:
        n1 -= 1
    left_run, batch = out[n1:n2], out[:n1]
    if not left_run:
        return None
    subs = (xs, ys)
    ls, rs = subs[first], subs[last]
    lperm = [ls.index(c) for c in batch if c in ls] + [ls.index(c) for c in left_run] + [ls.index(c) for c in summed]
    rperm = [rs.index(c) for c in batch if c in rs] + [rs.index(c) for c in summed] + [rs.index(c) for c in right_run]

    def form(xp, x, y):
        left, right = (x, y)[first], (x, y)[last]
        size = dict(zip(ls, left.shape))
        if any(size.get(c, n) != n for c, n in zip(rs, right.shape)):
            return None  # a shared index of extents 1 and n: numpy.einsum broadcasts it
        size.update(zip(rs, right.shape))
        m, n = math.prod(size[c] for c in left_run), math.prod(size[c] for c in right_run)
        if min(m, n) < MATMUL_MIN_SIDE:
            return None
        k = math.prod(size[c] for c in summed)
        lm = xp.transpose(left, lperm).reshape([size[c] if c in ls else 1 for c in batch] + [m, k])
        rm = xp.transpose(right, rperm).reshape([size[c] if c in rs else 1 for c in batch] + [k, n])
        r = xp.matmul(lm, rm)
        return _contiguous(xp, r.reshape([size[c] for c in out]))

    return form


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
    """``numpy.einsum(sub, *chunks, dtype=dtype)`` (a pair that is a GEMM as one
    broadcast ``matmul`` where :func:`_matmul_form` finds its views, else BLAS
    through ``optimize=True`` for pairs).  ``dtype``: compute in it (the whole einsum's result type: numpy
    sums booleans as counts once any operand is numeric, so a partial sum of two
    boolean operands must not be a logical or).  Named ``tensordot`` when two
    operands share a summed index, else ``einsum``; the time model classes it by
    its ``subscripts``.  Indices may be any characters (renamed to letters for
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
                  params=(letters or sub, dtype), subscripts=sub)


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


def _slice(x, bounds):
    index = [slice(None)] * x.ndim
    for a, start, step, length in bounds:
        stop = start + length * step
        index[a] = slice(start, stop if stop >= 0 else None, step)
    return _contiguous(array_module(x), x[tuple(index)])


def slice_kernel(bounds: tuple) -> Kernel:
    """``length`` elements from ``start`` at stride ``step`` along each ``(axis, start,
    step, length)`` of ``bounds`` (a slice of an axis that is one block: it falls inside
    the chunk)."""
    bounds = tuple((int(a), int(b), int(c), int(d)) for a, b, c, d in bounds)

    def shape(s):
        out = list(s)
        for a, start, step, length in bounds:
            if a >= len(s) or step == 0 or length < 1 or not 0 <= start < s[a] \
                    or not 0 <= start + (length - 1) * step < s[a]:
                raise KernelTypeError(f"slice{bounds}: chunk {s}")
            out[a] = length
        return tuple(out)

    return Kernel("slice", _slice, 1, shape, flops=lambda s: 0, params=(bounds,))


def _piece(x, g, axis, step):
    if step is None:  # the piece's positions in the chunk
        return _contiguous(array_module(x), x.take(g, axis=axis))
    return _slice(x, ((axis, g.shape[0], step, g.shape[1]),))


def piece_kernel(axis: int, step: int | None) -> Kernel:
    """The piece of a chunk a re-cut takes, joined with its
    :class:`~tra_dask.logical.Pieces` chunk: with a ``step``, an empty array of shape
    ``(start, count, 0)`` — ``count`` elements along ``axis`` from ``start`` at stride
    ``step``; without, the ``count`` positions themselves."""

    def shape(s, g):
        if step is None:
            ok = axis < len(s) and len(g) == 1 and g[0] >= 1
            count = g[0] if ok else 0
        else:
            ok = axis < len(s) and len(g) == 3 and g[1] >= 1 and 0 <= g[0] < s[axis] \
                and 0 <= g[0] + (g[1] - 1) * step < s[axis]
            count = g[1] if ok else 0
        if not ok:
            raise KernelTypeError(f"piece({axis}, step {step}): chunk {s}, piece {g}")
        return tuple(count if a == axis else n for a, n in enumerate(s))

    return Kernel("piece", _piece, 2, shape, dtype=lambda dx, dg: np.dtype(dx), flops=lambda s, g: 0,
                  params=(axis, step))


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


def _ufunc1(x, name):
    return getattr(array_module(x), name)(x)


@lru_cache(maxsize=None)
def ufunc_kernel(name: str) -> Kernel:
    """numpy's unary ufunc ``name`` (:data:`UNARY_UFUNCS`) on a chunk: elementwise, the
    dtype numpy's, and no algebraic law declared (``sin(max(a, b)) != max(sin(a), sin(b))``)."""
    f = UNARY_UFUNCS[name]

    def dtype(d):
        try:
            with np.errstate(all="ignore"):
                return f(np.ones(1, d)).dtype
        except TypeError as e:
            raise KernelTypeError(f"numpy.{name} of {np.dtype(d)}: {e}") from None

    return Kernel("ufunc", _ufunc1, 1, lambda s: s, dtype=dtype, flops=lambda s: math.prod(s), params=(name,),
                  elementwise=True)


def _astype(x, dtype):
    return x.astype(dtype)


@lru_cache(maxsize=None)
def astype_kernel(dtype: str) -> Kernel:
    """``chunk.astype(dtype)`` (numpy's unsafe cast, as ``ndarray.astype``)."""
    return Kernel("astype", _astype, 1, lambda s: s, dtype=lambda d: np.dtype(dtype), flops=lambda s: 0,
                  params=(dtype,), elementwise=True)


# ---------------------------------------------------------------------------
# reshape, concatenate, where


def _reshape(x, spec):
    return _contiguous(array_module(x), x).reshape(tuple(
        x.shape[v] if kind == "axis" else math.prod(x.shape[a] for a in v) if kind == "merge" else v
        for kind, v in spec))


def reshape_kernel(spec: tuple) -> Kernel:
    """A chunk reshaped: output axis ``o`` has the extent ``spec[o]`` says, ``("axis",
    a)`` (the chunk's axis ``a``: an axis the reshape keeps, cut as it is), ``("merge",
    (a, ...))`` (the product of the chunk's extents along those axes: a group merged
    into one axis, all but its first whole in the chunk, so that C order within the
    chunk is a run of C order of the group) or ``("n", n)`` (a whole axis of a group
    the reshape splits, which the chunking keeps in one block)."""
    spec = tuple((str(k), tuple(int(a) for a in v) if k == "merge" else int(v)) for k, v in spec)

    def extent(s, kind, v):
        return s[v] if kind == "axis" else math.prod(s[a] for a in v) if kind == "merge" else v

    def shape(s):
        out = tuple(extent(s, kind, v) for kind, v in spec)
        if math.prod(out) != math.prod(s):
            raise KernelTypeError(f"reshape{spec}: chunk {s} has {math.prod(s)} elements, not {math.prod(out)}")
        return out

    return Kernel("reshape", _reshape, 1, shape, flops=lambda s: 0, params=(spec,))


def _concat(a, b, axis):
    xp = array_module(a, b)
    return xp.concatenate([a, b], axis=axis)


def concat_kernel(axis: int) -> Kernel:
    """Two chunks side by side along ``axis`` (``numpy.concatenate``), in their promoted dtype."""

    def shape(sa, sb):
        if len(sa) != len(sb) or any(m != n for d, (m, n) in enumerate(zip(sa, sb)) if d != axis):
            raise KernelTypeError(f"concatenate along {axis}: chunks {sa} and {sb}")
        return tuple(m + n if d == axis else m for d, (m, n) in enumerate(zip(sa, sb)))

    return Kernel("concatenate", _concat, 2, shape, flops=lambda sa, sb: 0, params=(axis,))


def _where_pack(c, x, pc, px, rank, dtype):
    xp = array_module(c, x)
    cc, xx = _place(c, pc, rank), _place(x, px, rank)
    shape = tuple(np.broadcast_shapes(cc.shape, xx.shape))
    return xp.stack([xp.broadcast_to(xx, shape).astype(dtype), xp.broadcast_to(cc, shape).astype(dtype)])


def where_pack_kernel(pc: tuple, px: tuple, rank: int, dtype: str) -> Kernel:
    """The first join of ``where(c, x, y)``: ``[x, c]`` stacked on a new leading axis,
    both placed at ``rank`` output axes (``pc``, ``px``; size 1 elsewhere) and cast to
    the result's ``dtype`` (a condition cast to a number is exact: 0 or 1)."""

    def placed(s, p):
        out = [1] * rank
        for i, n in zip(p, s):
            out[i] = n
        return tuple(out)

    def shape(sc, sx):
        try:
            return (2,) + tuple(np.broadcast_shapes(placed(sc, pc), placed(sx, px)))
        except ValueError:
            raise KernelTypeError(f"where: chunks {sc} and {sx} do not broadcast") from None

    return Kernel("where_pack", _where_pack, 2, shape, dtype=lambda a, b: np.dtype(dtype),
                  flops=lambda sc, sx: 0, params=(tuple(pc), tuple(px), rank, dtype))


def _where_pick(p, y, py, rank, dtype):
    xp = array_module(p, y)
    return _contiguous(xp, xp.where(p[1] != 0, p[0], _place(y, py, rank)).astype(dtype, copy=False))


def where_pick_kernel(py: tuple, rank: int, dtype: str) -> Kernel:
    """The second join of ``where(c, x, y)``: ``x`` where ``c`` else ``y`` (``y`` at
    output axes ``py``), from the ``[x, c]`` stack of :func:`where_pack_kernel`."""

    def shape(sp, sy):
        out = [1] * rank
        for i, n in zip(py, sy):
            out[i] = n
        try:
            return tuple(np.broadcast_shapes(tuple(sp[1:]), tuple(out)))
        except ValueError:
            raise KernelTypeError(f"where: chunks {sp} and {sy} do not broadcast") from None

    return Kernel("where", _where_pick, 2, shape, dtype=lambda a, b: np.dtype(dtype),
                  flops=lambda sp, sy: math.prod(shape(sp, sy)), params=(tuple(py), rank, dtype))


# ---------------------------------------------------------------------------
# cumulative sums


def _cumsum(x, axis, dtype):
    xp = array_module(x)
    return _contiguous(xp, xp.cumsum(x, axis=axis, dtype=dtype))


def cumsum_kernel(axis: int, dtype: str) -> Kernel:
    """``numpy.cumsum(chunk, axis, dtype)``: the running sum within a chunk."""
    return Kernel("cumsum", _cumsum, 1, lambda s: s, dtype=lambda d: np.dtype(dtype),
                  flops=lambda s: math.prod(s), params=(axis, dtype))


def _second(a, b):
    return b


SECOND = Kernel("second", _second, 2, lambda sa, sb: sb, dtype=lambda da, db: np.dtype(db), flops=lambda sa, sb: 0)


def _add_prefix(c, p, axis):
    """A chunk's running sum ``c`` plus the sum of the chunks before it: ``p`` holds
    the totals of the chunks up to and including this one side by side along
    ``axis``, so all but its last slice are added (none, for the first chunk)."""
    xp = array_module(c, p)
    before = xp.take(p, list(range(p.shape[axis] - 1)), axis=axis)
    return _contiguous(xp, c + before.sum(axis=axis, keepdims=True).astype(c.dtype, copy=False))


def add_prefix_kernel(axis: int) -> Kernel:
    def shape(sc, sp):
        if len(sc) != len(sp) or sp[axis] < 1 or any(m != n for d, (m, n) in enumerate(zip(sc, sp)) if d != axis):
            raise KernelTypeError(f"add_prefix along {axis}: chunks {sc} and {sp}")
        return sc

    return Kernel("add_prefix", _add_prefix, 2, shape, flops=lambda sc, sp: 2 * math.prod(sc), params=(axis,))


# ---------------------------------------------------------------------------
# reductions

_REDUCE = {"sum": "sum", "max": "max", "min": "min", "prod": "prod", "any": "any", "all": "all"}


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
    """``numpy.sum/max/min/prod/any/all(chunk, axis=axes)``."""
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
    """The dtype a ``[value, index]`` pair is held in: one that holds every value of
    ``d`` and every index (uint64 for uint64: 2**63 and above wrap negative in int64)."""
    d = np.dtype(d)
    if d.kind in "fc" or d.itemsize > 8:
        return np.dtype(np.float64)
    return np.dtype(np.uint64) if d.kind == "u" and d.itemsize == 8 else np.dtype(np.int64)


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
