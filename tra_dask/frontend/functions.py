"""numpy functions over :class:`~.array.Array` beyond einsum: ``where``, ``concatenate``,
``stack``, ``reshape``, ``expand_dims``, ``squeeze``, ``var``/``std``, ``softmax`` and
``cov``, each with numpy's semantics (broadcasting, dtype promotion, keepdims,
negative axes) and each in the optimizer's terms: a join (``where`` is a three-way
join, two binary ones; ``concatenate`` joins its inputs' chunks on their other key
dims), a rekey and re-tile (``reshape``, ``expand_dims``, ``squeeze``), or the
reductions and elementwise ops the array already has (``var``, ``softmax``, ``cov``).

``take``, ``flip``, ``roll``, ``repeat`` and ``tile`` are re-cuts of an axis
(:mod:`.recut`: a join with the axis's pieces and a concat, placed and costed by the
plan); ``tril``/``triu`` a ``where`` with a mask made on the workers.

None of them adds a chunking search of its own: their axes join the expression's
axis classes (:mod:`.chunking`), the merged, split or concatenated ones as classes of
one block.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .array import Array, _filled, _FUNCTIONS, _is_scalar, _no_extras, _operand, from_array
from .chunking import AxisClasses
from .nodes import Concatenate, Gather, Index, Regrid, Reshape, Take, Where

__all__ = ["where", "concatenate", "stack", "reshape", "expand_dims", "squeeze", "var", "std", "softmax", "cov",
           "take", "flip", "roll", "repeat", "tile", "tril", "triu"]


def _axis(axis, ndim: int, where: str) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        # (numpy's AxisError: a ValueError and an IndexError, as numpy and the Array API raise)
        raise np.exceptions.AxisError(f"{where}: axis {axis!r} is out of range for rank {ndim}; valid axes: "
                                      f"{-ndim}..{ndim - 1}")
    return int(axis) % ndim


def where(condition, x=None, y=None) -> Array:
    """``numpy.where(condition, x, y)``: ``x`` where ``condition`` else ``y``, the three
    broadcast together (numpy's rules) and the result in the promotion of ``x`` and
    ``y`` (Python scalars weak, as numpy's).  A three-way join, as two binary joins.
    The one-argument form (``numpy.nonzero``) has a data-dependent shape and is refused.

    >>> import tra_dask as td
    >>> td.to_numpy(where(np.arange(4) > 1, np.arange(4), -1))
    array([-1, -1,  2,  3])
    """
    if x is None or y is None:
        raise TypeError("where: give condition, x and y (the one-argument form, numpy.nonzero, has a shape that "
                        "depends on the data and is not supported)")
    c = _operand(condition, "where condition")
    ops = []
    for v, name in ((x, "x"), (y, "y")):
        ops.append(v if _is_scalar(v) or isinstance(v, (bool, np.bool_)) else _operand(v, f"where {name}"))
    dtype = np.result_type(*[v.dtype if isinstance(v, Array) else v for v in ops])
    if dtype.kind not in "biufc":
        raise TypeError(f"where: x and y promote to {dtype}; use bool, integer, floating or complex values")
    ops = [v if isinstance(v, Array) else from_array(np.asarray(v, dtype=dtype)) for v in ops]
    if c.dtype != np.bool_:
        c = c.astype(bool)  # numpy's truth of each element (NaN is true)
    arrays = [c, *ops]
    try:
        shape = tuple(np.broadcast_shapes(*[a.shape for a in arrays]))
    except ValueError:
        raise ValueError(f"where: shapes {', '.join(str(a.shape) for a in arrays)} do not broadcast together "
                         f"(numpy rules: aligned from the right, equal or 1)") from None
    if 0 in shape or any(a.size == 0 for a in arrays):
        return _filled(shape, dtype)
    return Array(Where(shape, np.dtype(dtype), inputs=tuple(a._node for a in arrays)))


def concatenate(arrays, axis=0, dtype=None, out=None, casting="same_kind") -> Array:
    """``numpy.concatenate``: arrays of one rank, equal extents but along ``axis``
    (``None``: each flattened first), in their promoted dtype.  The inputs' chunks are
    joined on their other key dims and put side by side, so ``axis`` is one block in
    each input (given chunks that cut it are re-cut first, in the plan) and in the
    result (the other axes are cut alike, as the plan chooses)."""
    where_ = "concatenate"
    if out is not None:
        raise TypeError("concatenate: out= is not supported (a td.Array is lazy; use the result)")
    if isinstance(arrays, (Array,)) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{where_}: give a sequence of arrays, got {type(arrays).__name__}")
    xs = [_operand(a, f"{where_} operand {i}") for i, a in enumerate(arrays)]
    if not xs:
        raise ValueError(f"{where_}: need at least one array to concatenate")
    if axis is None:
        xs, axis = [x.reshape(-1) for x in xs], 0
    ndim = xs[0].ndim
    if ndim == 0:
        raise ValueError(f"{where_}: zero-dimensional arrays cannot be concatenated")
    for i, x in enumerate(xs):
        if x.ndim != ndim:
            raise ValueError(f"{where_}: operand 0 has {ndim} dimension(s) but operand {i} has {x.ndim}")
    axis = _axis(axis, ndim, where_)
    for i, x in enumerate(xs):
        bad = [d for d in range(ndim) if d != axis and x.shape[d] != xs[0].shape[d]]
        if bad:
            raise ValueError(f"{where_}: operand {i} has shape {x.shape} and operand 0 {xs[0].shape}: they must "
                             f"match except along axis {axis} (axis {bad[0]} differs)")
    result = np.result_type(*[x.dtype for x in xs]) if dtype is None else np.dtype(dtype)
    for i, x in enumerate(xs):
        if not np.can_cast(x.dtype, result, casting=casting):
            raise TypeError(f"{where_}: operand {i} ({x.dtype}) cannot be cast to {result} under casting={casting!r}")
    shape = tuple(sum(x.shape[axis] for x in xs) if d == axis else n for d, n in enumerate(xs[0].shape))
    xs = [x.astype(result) for x in xs if x.size]  # an empty input adds nothing
    if 0 in shape or not xs:
        return _filled(shape, result)
    if len(xs) == 1:
        return xs[0]
    xs = [_whole(x, (axis,)) for x in xs]
    return Array(Concatenate(shape, np.dtype(result), inputs=tuple(x._node for x in xs), axis=axis))


def stack(arrays, axis=0, out=None, dtype=None, casting="same_kind") -> Array:
    """``numpy.stack``: arrays of one shape along a new ``axis`` (each gets an axis of
    extent 1 there, then they are concatenated: the new axis is one block)."""
    if out is not None:
        raise TypeError("stack: out= is not supported (a td.Array is lazy; use the result)")
    if isinstance(arrays, Array) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"stack: give a sequence of arrays, got {type(arrays).__name__}")
    xs = [_operand(a, f"stack operand {i}") for i, a in enumerate(arrays)]
    if not xs:
        raise ValueError("stack: need at least one array to stack")
    for i, x in enumerate(xs):
        if x.shape != xs[0].shape:
            raise ValueError(f"stack: all input arrays must have the same shape; operand {i} has {x.shape}, "
                             f"operand 0 {xs[0].shape}")
    axis = _axis(axis, xs[0].ndim + 1, "stack")
    return concatenate([expand_dims(x, axis) for x in xs], axis=axis, dtype=dtype, casting=casting)


def expand_dims(x, axis) -> Array:
    """``numpy.expand_dims``: axes of extent 1 at ``axis`` (an int or a tuple, in the
    result's numbering): a rekey with a constant key dim, no data moved."""
    x = _operand(x, "expand_dims")
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    rank = x.ndim + len(axes)
    pos = [_axis(a, rank, "expand_dims") for a in axes]
    if len(set(pos)) != len(pos):
        raise ValueError(f"expand_dims: axis {axis!r} repeats an axis")
    return x._expand(pos)


def squeeze(x, axis=None) -> Array:
    """``numpy.squeeze``: axes of extent 1 dropped (each one a take of index 0)."""
    x = _operand(x, "squeeze")
    if axis is None:
        axes = [a for a, n in enumerate(x.shape) if n == 1]
    else:
        axes = [_axis(a, x.ndim, "squeeze") for a in ((axis,) if not isinstance(axis, (tuple, list)) else axis)]
        bad = [a for a in axes if x.shape[a] != 1]
        if bad:
            raise ValueError(f"squeeze: cannot select an axis to squeeze out which has size not equal to one "
                             f"(axis {bad[0]} of shape {x.shape})")
    out = x
    for a in sorted(set(axes), reverse=True):
        if out.size == 0:
            out = _filled(tuple(n for d, n in enumerate(out.shape) if d != a), out.dtype)
            continue
        node = out._node
        out = Array(Take(tuple(n for d, n in enumerate(node.shape) if d != a), node.dtype, inputs=(node,),
                         axis=a, index=0))
    return out


def _groups(ins: tuple, outs: tuple) -> tuple:
    """The reshape of ``ins`` to ``outs`` (C order, equal sizes, no zero) as groups of
    consecutive axes with equal products; an axis of extent 1 on one side only is a
    group of its own."""
    groups, i, j = [], 0, 0
    while i < len(ins) or j < len(outs):
        if j < len(outs) and outs[j] == 1 and (i == len(ins) or ins[i] != 1):
            groups.append(((), (j,)))
            j += 1
            continue
        if i < len(ins) and ins[i] == 1 and (j == len(outs) or outs[j] != 1):
            groups.append(((i,), ()))
            i += 1
            continue
        gi, gj, pi, pj = [i], [j], ins[i], outs[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(i)
                pi *= ins[i]
                i += 1
            else:
                gj.append(j)
                pj *= outs[j]
                j += 1
        groups.append((tuple(gi), tuple(gj)))
    return tuple(groups)


def _whole(x: Array, axes) -> Array:
    """``x``, re-cut to one block along those of ``axes`` that its given chunks cut
    (:class:`~.nodes.Regrid`: a re-cut the plan costs), for an operation that needs
    them whole."""
    cl = AxisClasses([x._node])
    cut = []
    for a in axes:  # (a class's extent is its longest axis's: a slice of a given grid is cut as the grid is)
        ci = cl.of[(x._node, a)]
        if any(b < cl.extent[ci] for b in cl.pinned(ci)):
            cut.append(a)
    cut = tuple(cut)
    return Array(Regrid(x.shape, x.dtype, inputs=(x._node,), axes=cut)) if cut else x


def reshape(x, shape, order="C", copy=None) -> Array:
    """``numpy.reshape`` in C order (``order='C'`` only; one ``-1`` allowed).  An axis
    the reshape keeps stays cut as it is (a rekey); a group of axes it merges into one
    keeps its first axis cut and the others in one block (each chunk reshaped on its
    own is a run of the merged axis, re-cut to its blocks in the plan); the axes of a
    group it splits are one block each; given chunks that cut an axis that must be
    whole are re-cut to one block first, in the plan.

    >>> import tra_dask as td
    >>> td.to_numpy(reshape(np.arange(6), (2, 3)))
    array([[0, 1, 2],
           [3, 4, 5]])
    """
    x = _operand(x, "reshape")
    if order != "C":
        raise ValueError(f"reshape: order={order!r} is not supported; a td.Array reshapes in C order ('C')")
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(int(_extent(n)) for n in shape)
    except TypeError:
        raise TypeError(f"reshape: the new shape must be ints, got {shape!r}") from None
    if sum(n == -1 for n in shape) > 1 or any(n < -1 for n in shape):
        raise ValueError(f"reshape: shape {shape} may have one -1 and no other negative extent")
    known = math.prod(n for n in shape if n != -1)
    if -1 in shape:
        if known == 0 or x.size % known:
            raise ValueError(f"reshape: cannot reshape array of size {x.size} into shape {shape}")
        shape = tuple(x.size // known if n == -1 else n for n in shape)
    if math.prod(shape) != x.size:
        raise ValueError(f"reshape: cannot reshape array of size {x.size} into shape {shape}")
    if shape == x.shape:
        return x
    if x.size == 0:
        return _filled(shape, x.dtype)
    groups = _groups(x.shape, shape)
    node = Reshape(shape, x.dtype, inputs=(x._node,), groups=groups)
    x = _whole(x, [a for i, a in node.whole() if i == 0])
    return Array(Reshape(shape, x.dtype, inputs=(x._node,), groups=groups))


def _extent(n):
    import operator

    if isinstance(n, (bool, np.bool_)):
        raise TypeError("bool is not an extent")
    return operator.index(n)


def var(x, axis=None, ddof=0, keepdims=False, *, correction=None, label: str = "var") -> Array:
    """``numpy.var``: ``sum(abs(x - mean)**2) / (n - ddof)`` over ``axis``, the mean
    taken first with ``keepdims`` and broadcast back (two passes, as numpy's);
    integers and booleans in float64, complex numbers give their real dtype."""
    x = _operand(x, label)
    if correction is not None:
        ddof = correction
    if not isinstance(ddof, numbers.Real) or isinstance(ddof, (bool, np.bool_)):
        raise TypeError(f"{label}: ddof must be a real number, got {ddof!r}")
    axes = x._axes(axis, label)
    if x.dtype.kind in "biu":
        x = x.astype(np.float64)
    n = math.prod(x.shape[a] for a in axes)
    out_dtype = np.empty(0, x.dtype).real.dtype
    if x.size == 0:
        shape = tuple(1 if a in axes else m for a, m in enumerate(x.shape) if keepdims or a not in axes)
        return _filled(shape, out_dtype, np.nan if n == 0 else None)
    d = x - x.mean(axis=axes, keepdims=True)
    sq = (d * d.conj()).real if d.dtype.kind == "c" else np.square(d)  # (a transform, not a self-join: x*x exactly)
    s = sq.sum(axis=axes, keepdims=keepdims) if axes else sq
    return s / max(n - ddof, 0)


def std(x, axis=None, ddof=0, keepdims=False, *, correction=None, label: str = "std") -> Array:
    """``numpy.std``: the square root of :func:`var`."""
    return np.sqrt(var(x, axis, ddof, keepdims, correction=correction, label=label))


def softmax(x, axis=-1) -> Array:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis`` (the max subtracted for
    stability, broadcast back with keepdims: no axis leaves its chunking class).

    >>> import tra_dask as td
    >>> td.to_numpy(softmax(np.log([[1.0, 3.0]]))).round(3)
    array([[0.25, 0.75]])
    """
    x = _operand(x, "softmax")
    if x.dtype.kind == "c":
        raise TypeError(f"softmax: not defined for complex numbers ({x.dtype}): the max it subtracts needs an order")
    axes = x._axes(axis, "softmax")
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None, *, dtype=None) -> Array:
    """``numpy.cov``: rows are variables (``rowvar``), columns observations; the
    centred data times its conjugate transpose over ``N - ddof`` (an einsum).  No
    ``fweights``/``aweights``."""
    if fweights is not None or aweights is not None:
        raise TypeError("cov: fweights= and aweights= are not supported")
    if ddof is not None and (not isinstance(ddof, (int, np.integer)) or isinstance(ddof, (bool, np.bool_))):
        raise ValueError(f"cov: ddof must be an integer, got {ddof!r}")
    X = _operand(m, "cov m")
    if X.ndim > 2:
        raise ValueError(f"cov: m has more than 2 dimensions (shape {X.shape})")
    result = np.result_type(X.dtype, np.float64) if dtype is None else np.dtype(dtype)
    X = X[None, :] if X.ndim == 1 else X
    if not rowvar and X.shape[0] != 1:
        X = X.T
    if y is not None:
        Y = _operand(y, "cov y")
        if Y.ndim > 2:
            raise ValueError(f"cov: y has more than 2 dimensions (shape {Y.shape})")
        result = np.result_type(result, Y.dtype)
        Y = Y[None, :] if Y.ndim == 1 else Y
        if not rowvar and Y.shape[0] != 1:
            Y = Y.T
        X = concatenate([X, Y], axis=0)
    X = X.astype(result)
    ddof = (0 if bias else 1) if ddof is None else int(ddof)
    n = X.shape[1]
    fact = max(n - ddof, 0)
    Xc = X - X.mean(axis=1, keepdims=True)
    c = (Xc @ Xc.T.conj()) * (1.0 / fact if fact else np.inf)
    return squeeze(c)


# numpy's functions on td.Arrays (``__array_function__``)
def gather(x, axis: int, index, step=None) -> Array:
    """``x`` with element ``o`` along ``axis`` taken from ``index[o]`` (non-negative,
    in range: the callers check)."""
    x = _operand(x, "gather")
    index = np.asarray(index, dtype=np.int64).reshape(-1)
    shape = x.shape[:axis] + (len(index),) + x.shape[axis + 1:]
    if 0 in shape or x.size == 0:
        return _filled(shape, x.dtype)
    if step == 1 and len(index) == x.shape[axis] and np.array_equal(index, np.arange(len(index))):
        return x
    return Array(Gather(shape, x.dtype, inputs=(x._node,), axis=axis, index=Index(index), step=step))


def _indices(indices, n: int, where: str) -> np.ndarray:
    """Integer positions along an axis of ``n`` (negative ones from the end), or an
    IndexError naming the first out of range."""
    if isinstance(indices, Array):
        raise TypeError(f"{where}: indices that are a td.Array are not supported (the result's shape would "
                        f"depend on data not computed yet); pass a numpy array or a list")
    idx = np.asarray(indices)
    if idx.dtype == bool or idx.dtype.kind not in "iu":
        if idx.size or idx.dtype.kind not in "f":
            raise IndexError(f"{where}: indices must be integers, got {idx.dtype}")
        idx = idx.astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise IndexError(f"{where}: index {int(idx[bad].reshape(-1)[0])} is out of bounds for an axis of extent {n}")
    return np.where(idx < 0, idx + n, idx).astype(np.int64)


def take(x, indices, axis=None, out=None, mode="raise") -> Array:
    """``numpy.take``: the elements at ``indices`` along ``axis`` (None: of the
    flattened array), a re-cut of that axis; ``indices`` of any shape (its axes take
    the axis's place)."""
    _no_extras("take", out=out)
    if mode != "raise":
        raise ValueError(f"take: mode={mode!r} is not supported; only 'raise'")
    x = _operand(x, "numpy.take")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = _axis(axis, x.ndim, "take")
    idx = _indices(indices, x.shape[axis], "take")
    flat = gather(x, axis, idx.reshape(-1))
    if idx.ndim == 1:
        return flat
    return flat.reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1:])


def flip(m, axis=None) -> Array:
    """``numpy.flip``: the order of the elements along ``axis`` (None: every axis)
    reversed — a slice of step -1."""
    x = _operand(m, "numpy.flip")
    axes = range(x.ndim) if axis is None else [_axis(a, x.ndim, "flip") for a in np.atleast_1d(axis).tolist()]
    if len(set(axes)) != len(axes):
        raise ValueError(f"flip: repeated axis in {axis!r}")
    index = [slice(None)] * x.ndim
    for a in axes:
        index[a] = slice(None, None, -1)
    return x[tuple(index)]


def roll(a, shift, axis=None) -> Array:
    """``numpy.roll``: elements shifted by ``shift`` along ``axis`` (None: the
    flattened array, shaped back), those past the end coming round to the start."""
    x = _operand(a, "numpy.roll")
    if axis is None:
        if not isinstance(shift, numbers.Integral):
            raise TypeError(f"roll: with axis=None the shift is one int, got {shift!r}")
        return roll(x.reshape(-1), shift, 0).reshape(x.shape)
    shifts, axes = np.broadcast_arrays(np.atleast_1d(shift), np.atleast_1d(axis))
    total: dict = {}
    for s, ax in zip(shifts.tolist(), axes.tolist()):
        ax = _axis(ax, x.ndim, "roll")
        total[ax] = total.get(ax, 0) + int(s)
    for ax, s in total.items():
        n = x.shape[ax]
        if n:
            x = gather(x, ax, (np.arange(n) - s) % n, step=1)
    return x


def repeat(a, repeats, axis=None) -> Array:
    """``numpy.repeat``: each element along ``axis`` (None: of the flattened array)
    ``repeats`` times (an int, or one count per element)."""
    x = _operand(a, "numpy.repeat")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = _axis(axis, x.ndim, "repeat")
    reps = np.asarray(repeats)
    if reps.size == 0:  # (numpy's [] is float: no counts, for an empty axis)
        reps = reps.astype(np.int64)
    if reps.dtype.kind not in "iu" or reps.ndim > 1 or (reps < 0).any():
        raise ValueError(f"repeat: repeats must be non-negative ints (one, or one per element), got {repeats!r}")
    n = x.shape[axis]
    if reps.ndim == 1 and len(reps) not in (1, n):
        raise ValueError(f"repeat: {len(reps)} repeats for an axis of extent {n}; give one or {n}")
    return gather(x, axis, np.repeat(np.arange(n), reps))


def tile(A, reps) -> Array:
    """``numpy.tile``: ``A`` repeated ``reps`` times along each axis (new leading
    axes where ``reps`` is longer)."""
    x = _operand(A, "numpy.tile")
    reps = tuple(int(r) for r in np.atleast_1d(reps).tolist())
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: reps must be non-negative, got {reps}")
    if len(reps) > x.ndim:
        x = x.reshape((1,) * (len(reps) - x.ndim) + x.shape)
    reps = (1,) * (x.ndim - len(reps)) + reps
    for ax, r in enumerate(reps):
        if r != 1:
            x = gather(x, ax, np.tile(np.arange(x.shape[ax]), r), step=1)
    return x


class _Triangle:
    """``fn(region)`` of a triangle's mask: True where ``column - row`` is at most
    ``k`` (``lower``) or at least ``k``."""

    def __init__(self, k: int, lower: bool):
        self.k, self.lower = int(k), bool(lower)

    def __call__(self, region):
        r, c = region[-2:]
        d = np.arange(c.start, c.stop)[None, :] - np.arange(r.start, r.stop)[:, None]
        mask = d <= self.k if self.lower else d >= self.k
        return np.broadcast_to(mask, tuple(s.stop - s.start for s in region)).copy()

    def __eq__(self, other):
        return isinstance(other, _Triangle) and (self.k, self.lower) == (other.k, other.lower)

    def __hash__(self):
        return hash(("triangle", self.k, self.lower))


def _triangle(m, k, lower: bool, label: str) -> Array:
    from .array import from_region

    x = _operand(m, label)
    if x.ndim < 2:
        raise ValueError(f"{label}: needs an array of rank 2 or more (the last two axes), got shape {x.shape}")
    if x.size == 0:
        return x
    mask = from_region(_Triangle(k, lower), x.shape[-2:], bool, name=f"{label.split('.')[-1]}[k={k}]")
    return where(mask, x, np.zeros((), x.dtype))


def tril(m, k=0) -> Array:
    """``numpy.tril``: the elements on and below diagonal ``k`` of the last two axes, zeros above."""
    return _triangle(m, k, True, "numpy.tril")


def triu(m, k=0) -> Array:
    """``numpy.triu``: the elements on and above diagonal ``k`` of the last two axes, zeros below."""
    return _triangle(m, k, False, "numpy.triu")




def _np_std_var(name):
    def f(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, mean=None, correction=None):
        _no_extras(name, dtype=dtype, out=out, where=where, mean=mean)
        return (var if name == "var" else std)(a, axis, ddof, keepdims, correction=correction, label=f"numpy.{name}")
    return f


def _np_where(condition, x=None, y=None):
    return where(condition, x, y)


def _np_reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    return reshape(a, shape if shape is not None else newshape, order=order)


def _np_ravel(a, order="C"):
    return reshape(a, -1, order=order)


def _np_squeeze(a, axis=None):
    return squeeze(a, axis)


_FUNCTIONS.update({
    np.take: take,
    np.flip: flip,
    np.flipud: lambda m: flip(m, 0),
    np.fliplr: lambda m: flip(m, 1),
    np.roll: roll,
    np.repeat: repeat,
    np.tile: tile,
    np.tril: tril,
    np.triu: triu,
    np.std: _np_std_var("std"),
    np.var: _np_std_var("var"),
    np.where: _np_where,
    np.concatenate: concatenate,
    np.stack: stack,
    np.reshape: _np_reshape,
    np.ravel: _np_ravel,
    np.expand_dims: expand_dims,
    np.squeeze: _np_squeeze,
    np.cov: cov,
})
