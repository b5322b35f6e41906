"""The Array API namespace of tra_dask (``td.Array.__array_namespace__()``).

Code written against the `Python Array API standard
<https://data-apis.org/array-api/>`_ runs on tra_dask with ``xp = x.__array_namespace__()``
(or ``import tra_dask.array_api as xp``): the creation functions (made on the workers,
where the plan puts each chunk), the elementwise functions, the reductions, the
manipulation functions and the linear-algebra functions the library expresses in
the tensor relational algebra.  Every function returns a lazy :class:`td.Array`;
nothing runs until a result is asked for (``td.compute``, ``numpy.asarray``, or a
Python scalar of a one-element array: ``float(xp.sum(x))``).

``take``, ``flip``, ``roll``, ``repeat`` and ``tile`` re-cut an axis inside the plan
(:mod:`.recut`).  Not here (their shapes depend on the data, or they need an order
across chunks that the algebra has no operator for yet): sorting and set functions,
``nonzero``, ``searchsorted``, ``cumulative_prod``, in-place updates (``__setitem__``),
the ``linalg`` and ``fft`` extensions, DLPack.

>>> import numpy as np, tra_dask as td
>>> xp = td.from_array(np.ones(3)).__array_namespace__()
>>> td.to_numpy(xp.sum(xp.arange(4, dtype=xp.float64) * 2))
array(12.)
"""

from __future__ import annotations

import builtins
import math

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .array import DEVICE, Array, _check_leaf, _filled, _operand, from_array, from_region
from .array import einsum as td_einsum, matmul as _matmul, tensordot as _tensordot
from . import functions as _f

__array_api_version__ = "2023.12"
SUPPORTED_VERSIONS = ("2021.12", "2022.12", "2023.12")

# -- data types -----------------------------------------------------------------
bool = np.dtype(np.bool_)  # noqa: A001  (the standard's name)
int8, int16, int32, int64 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
uint8, uint16, uint32, uint64 = (np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
float32, float64 = np.dtype(np.float32), np.dtype(np.float64)
complex64, complex128 = np.dtype(np.complex64), np.dtype(np.complex128)

e, pi, inf, nan, newaxis = math.e, math.pi, math.inf, math.nan, None

_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu", "real floating": "f",
          "complex floating": "c", "numeric": "iufc"}


def isdtype(dtype, kind) -> bool:
    """Whether ``dtype`` is of ``kind`` (a dtype, a kind name, or a tuple of them)."""
    if isinstance(kind, tuple):
        return builtins.any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r}; valid: {', '.join(_KINDS)}")
        return np.dtype(dtype).kind in _KINDS[kind]
    return np.dtype(dtype) == np.dtype(kind)


def _dtype_of(x):
    return x.dtype if isinstance(x, Array) or hasattr(x, "dtype") and not isinstance(x, type) else x


def result_type(*arrays_and_dtypes):
    """numpy's promotion (Python scalars weak, as the standard's)."""
    return np.result_type(*[_dtype_of(x) for x in arrays_and_dtypes])


def can_cast(from_, to, /) -> bool:
    return np.can_cast(_dtype_of(from_), to)


class _FInfo:
    """``finfo``: the standard's fields, as Python floats."""

    def __init__(self, dtype):
        f = np.finfo(dtype)
        self.bits, self.dtype = int(f.bits), np.dtype(f.dtype)
        self.eps, self.max, self.min = float(f.eps), float(f.max), float(f.min)
        self.smallest_normal = float(f.smallest_normal)

    def __repr__(self):
        return f"finfo(dtype={self.dtype}, bits={self.bits}, eps={self.eps}, max={self.max}, min={self.min})"


class _IInfo:
    """``iinfo``: the standard's fields, as Python ints."""

    def __init__(self, dtype):
        i = np.iinfo(dtype)
        self.bits, self.max, self.min, self.dtype = int(i.bits), int(i.max), int(i.min), np.dtype(i.dtype)

    def __repr__(self):
        return f"iinfo(dtype={self.dtype}, bits={self.bits}, max={self.max}, min={self.min})"


def finfo(type, /):  # noqa: A002
    return _FInfo(_dtype_of(type))


def iinfo(type, /):  # noqa: A002
    return _IInfo(_dtype_of(type))


def astype(x, dtype, /, *, copy=True, device=None):
    _device(device, "astype")
    return _operand(x, "astype").astype(dtype)


class _Info:
    """``__array_namespace_info__()``: one device, numpy's default dtypes."""

    def capabilities(self):
        return {"boolean indexing": False, "data-dependent shapes": False, "max dimensions": None}

    def default_device(self):
        return DEVICE

    def devices(self):
        return [DEVICE]

    def default_dtypes(self, *, device=None):
        return {"real floating": float64, "complex floating": complex128, "integral": int64, "indexing": int64}

    def dtypes(self, *, device=None, kind=None):
        every = {"bool": bool, "int8": int8, "int16": int16, "int32": int32, "int64": int64, "uint8": uint8,
                 "uint16": uint16, "uint32": uint32, "uint64": uint64, "float32": float32, "float64": float64,
                 "complex64": complex64, "complex128": complex128}
        return every if kind is None else {n: d for n, d in every.items() if isdtype(d, kind)}


def __array_namespace_info__():
    return _Info()


def _device(device, where):
    if device is not None and device != DEVICE:
        raise ValueError(f"{where}: the only device is {DEVICE!r}, got {device!r}")


# -- creation ---------------------------------------------------------------------
def asarray(obj, /, *, dtype=None, device=None, copy=None):
    """An array of ``obj`` (a td.Array, a submission's futures, numpy/dask arrays,
    nested sequences, Python scalars), cast to ``dtype`` if given."""
    _device(device, "asarray")
    if isinstance(obj, Array) or hasattr(obj, "__tra_relation__"):
        x = from_array(obj)
        return x if dtype is None else x.astype(dtype)
    if copy is False:
        raise ValueError("asarray: copy=False is not possible (the data is put into a lazy td.Array)")
    return from_array(np.array(obj, dtype=dtype))


def _shape(shape):
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)


def _default(dtype, value):
    if dtype is not None:
        return np.dtype(dtype)
    return np.result_type(value) if not isinstance(value, np.generic) else value.dtype


def full(shape, fill_value, *, dtype=None, device=None):
    """``fill_value`` everywhere, made on the workers where the plan puts each chunk
    (the shape's extents ints >= 0 and the dtype numeric, checked here)."""
    _device(device, "full")
    dtype = _default(dtype, fill_value)
    return _filled(_check_leaf("full", shape, dtype, empty=True), dtype, fill_value)


def zeros(shape, *, dtype=None, device=None):
    return full(shape, 0, dtype=float64 if dtype is None else dtype, device=device)


def ones(shape, *, dtype=None, device=None):
    return full(shape, 1, dtype=float64 if dtype is None else dtype, device=device)


def empty(shape, *, dtype=None, device=None):
    """Zeros (an uninitialised array has no meaning for a lazy one)."""
    return zeros(shape, dtype=dtype, device=device)


def full_like(x, /, fill_value, *, dtype=None, device=None):
    return full(x.shape, fill_value, dtype=x.dtype if dtype is None else dtype, device=device)


def zeros_like(x, /, *, dtype=None, device=None):
    return full_like(x, 0, dtype=dtype, device=device)


def ones_like(x, /, *, dtype=None, device=None):
    return full_like(x, 1, dtype=dtype, device=device)


def empty_like(x, /, *, dtype=None, device=None):
    return zeros_like(x, dtype=dtype, device=device)


class _Arange:
    """``fn(region)`` of :func:`arange`: ``start + i * step`` for the region's ``i``."""

    def __init__(self, start, step, dtype):
        self.start, self.step, self.dtype = start, step, np.dtype(dtype)

    def __call__(self, region):
        (r,) = region
        return (self.start + np.arange(r.start, r.stop) * self.step).astype(self.dtype)

    def __eq__(self, other):
        return isinstance(other, _Arange) and (self.start, self.step, self.dtype) == (other.start, other.step,
                                                                                      other.dtype)

    def __hash__(self):
        return hash(("arange", self.start, self.step, str(self.dtype)))


def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    """``numpy.arange``, made on the workers."""
    _device(device, "arange")
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be 0")
    n = builtins.max(0, math.ceil((stop - start) / step))
    floats = builtins.any(isinstance(v, float) for v in (start, stop, step))
    dtype = np.dtype(dtype) if dtype is not None else float64 if floats else np.dtype(np.int64)
    if n == 0:
        return _filled((0,), dtype)
    return from_region(_Arange(start, step, dtype), (n,), dtype, name=f"arange[{start}:{stop}:{step}]")


class _Linspace:
    def __init__(self, start, stop, num, endpoint, dtype):
        self.args = (start, stop, int(num), builtins.bool(endpoint), np.dtype(dtype))

    def __call__(self, region):
        start, stop, num, endpoint, dtype = self.args
        (r,) = region
        return np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype)[r]

    def __eq__(self, other):
        return isinstance(other, _Linspace) and self.args == other.args

    def __hash__(self):
        return hash(("linspace",) + self.args[:4] + (str(self.args[4]),))


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    _device(device, "linspace")
    dtype = np.dtype(dtype) if dtype is not None else np.result_type(start, stop, 1.0)
    if num == 0:
        return _filled((0,), dtype)
    return from_region(_Linspace(start, stop, num, endpoint, dtype), (int(num),), dtype, name="linspace")


class _Eye:
    def __init__(self, k, dtype):
        self.k, self.dtype = int(k), np.dtype(dtype)

    def __call__(self, region):
        r, c = region
        return (np.arange(r.start, r.stop)[:, None] + self.k == np.arange(c.start, c.stop)[None, :]).astype(self.dtype)

    def __eq__(self, other):
        return isinstance(other, _Eye) and (self.k, self.dtype) == (other.k, other.dtype)

    def __hash__(self):
        return hash(("eye", self.k, str(self.dtype)))


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    _device(device, "eye")
    n_cols = n_rows if n_cols is None else n_cols
    dtype = float64 if dtype is None else np.dtype(dtype)
    if n_rows == 0 or n_cols == 0:
        return _filled((n_rows, n_cols), dtype)
    return from_region(_Eye(k, dtype), (int(n_rows), int(n_cols)), dtype, name=f"eye[k={k}]")


# -- elementwise ------------------------------------------------------------------
def _array(x, where):
    return x if isinstance(x, Array) else asarray(x)


def _unary(ufunc):
    def f(x, /):
        return ufunc(_operand(x, ufunc.__name__))
    f.__name__ = ufunc.__name__
    return f


def _binary(ufunc, name):
    def f(x1, x2, /):
        if not isinstance(x1, Array) and not isinstance(x2, Array):
            x1 = asarray(x1)
        return ufunc(x1, x2)
    f.__name__ = name
    return f


abs = _unary(np.absolute)  # noqa: A001
acos, acosh, asin, asinh = _unary(np.arccos), _unary(np.arccosh), _unary(np.arcsin), _unary(np.arcsinh)
atan, atanh = _unary(np.arctan), _unary(np.arctanh)
bitwise_invert = _unary(np.invert)
ceil, cos, cosh, exp, expm1, floor = (_unary(u) for u in (np.ceil, np.cos, np.cosh, np.exp, np.expm1, np.floor))
isfinite, isinf, isnan = _unary(np.isfinite), _unary(np.isinf), _unary(np.isnan)
log, log1p, log2, log10 = _unary(np.log), _unary(np.log1p), _unary(np.log2), _unary(np.log10)
logical_not, negative, positive = _unary(np.logical_not), _unary(np.negative), _unary(np.positive)
reciprocal, sign, signbit = _unary(np.reciprocal), _unary(np.sign), _unary(np.signbit)
sin, sinh, square, sqrt, tan, tanh, trunc = (_unary(u) for u in (np.sin, np.sinh, np.square, np.sqrt, np.tan, np.tanh,
                                                                 np.trunc))


def round(x, /):  # noqa: A001
    """Round half to even; integers and booleans are returned as they are (their dtype kept)."""
    x = _operand(x, "round")
    return x if x.dtype.kind in "biu" else np.rint(x)


def conj(x, /):
    return _operand(x, "conj").conj()


def real(x, /):
    return _operand(x, "real").real


def imag(x, /):
    return _operand(x, "imag").imag


add, atan2 = _binary(np.add, "add"), _binary(np.arctan2, "atan2")
bitwise_and, bitwise_or, bitwise_xor = (_binary(np.bitwise_and, "bitwise_and"), _binary(np.bitwise_or, "bitwise_or"),
                                        _binary(np.bitwise_xor, "bitwise_xor"))
bitwise_left_shift, bitwise_right_shift = (_binary(np.left_shift, "bitwise_left_shift"),
                                           _binary(np.right_shift, "bitwise_right_shift"))
copysign, divide, equal = _binary(np.copysign, "copysign"), _binary(np.true_divide, "divide"), _binary(np.equal, "equal")
floor_divide, greater = _binary(np.floor_divide, "floor_divide"), _binary(np.greater, "greater")
greater_equal, hypot = _binary(np.greater_equal, "greater_equal"), _binary(np.hypot, "hypot")
less, less_equal = _binary(np.less, "less"), _binary(np.less_equal, "less_equal")
logaddexp, logical_and = _binary(np.logaddexp, "logaddexp"), _binary(np.logical_and, "logical_and")
logical_or, logical_xor = _binary(np.logical_or, "logical_or"), _binary(np.logical_xor, "logical_xor")
maximum, minimum = _binary(np.maximum, "maximum"), _binary(np.minimum, "minimum")
multiply, not_equal = _binary(np.multiply, "multiply"), _binary(np.not_equal, "not_equal")
pow, remainder = _binary(np.power, "pow"), _binary(np.remainder, "remainder")  # noqa: A001
subtract = _binary(np.subtract, "subtract")


def clip(x, /, min=None, max=None):  # noqa: A002
    """``minimum(maximum(x, min), max)`` in ``x``'s dtype."""
    x = _operand(x, "clip")
    out = x
    if min is not None:
        out = maximum(out, min)
    if max is not None:
        out = minimum(out, max)
    return out.astype(x.dtype)


# -- reductions -------------------------------------------------------------------
def _reduce(name):
    def f(x, /, *, axis=None, keepdims=False):
        return getattr(_operand(x, name), name)(axis=axis, keepdims=keepdims)
    f.__name__ = name
    return f


max, min, any, all = _reduce("max"), _reduce("min"), _reduce("any"), _reduce("all")  # noqa: A001


def _sum_like(name):
    def f(x, /, *, axis=None, dtype=None, keepdims=False):
        x = _operand(x, name)
        if dtype is not None:  # (summed in numpy's dtype for it, then cast: modular for integers, as numpy's)
            return getattr(x.astype(dtype), name)(axis=axis, keepdims=keepdims).astype(dtype)
        if x.dtype.kind in "iu" and x.dtype.itemsize < 8:  # the standard: the default integer dtype
            x = x.astype(int64 if x.dtype.kind == "i" else uint64)
        return getattr(x, name)(axis=axis, keepdims=keepdims)
    f.__name__ = name
    return f


sum, prod = _sum_like("sum"), _sum_like("prod")  # noqa: A001


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    """Running sums along ``axis`` (None: a 1-d array's only axis); ``include_initial``:
    a zero first (concatenated: that axis then one block)."""
    x = _operand(x, "cumulative_sum")
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"cumulative_sum: axis=None needs a 1-d array, got shape {x.shape}")
        axis = 0
    if dtype is None and x.dtype.kind in "iu" and x.dtype.itemsize < 8:
        dtype = int64 if x.dtype.kind == "i" else uint64
    out = x.cumsum(axis=axis, dtype=dtype)
    if include_initial:
        a = axis % x.ndim
        shape = tuple(1 if d == a else n for d, n in enumerate(x.shape))
        out = _f.concatenate([full(shape, 0, dtype=out.dtype), out], axis=a)
    return out


def mean(x, /, *, axis=None, keepdims=False):
    return _operand(x, "mean").mean(axis=axis, keepdims=keepdims)


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    return _f.var(x, axis=axis, ddof=correction, keepdims=keepdims)


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    return _f.std(x, axis=axis, ddof=correction, keepdims=keepdims)


def argmax(x, /, *, axis=None, keepdims=False):
    x = _operand(x, "argmax")
    out = x.argmax(axis=axis)
    if not keepdims:
        return out
    return expand_dims(out, axis=axis) if axis is not None else out.reshape((1,) * x.ndim)


def argmin(x, /, *, axis=None, keepdims=False):
    x = _operand(x, "argmin")
    out = x.argmin(axis=axis)
    if not keepdims:
        return out
    return expand_dims(out, axis=axis) if axis is not None else out.reshape((1,) * x.ndim)


# -- manipulation -----------------------------------------------------------------
def where(condition, x1, x2, /):
    return _f.where(condition, x1, x2)


def concat(arrays, /, *, axis=0):
    return _f.concatenate(list(arrays), axis=axis)


def stack(arrays, /, *, axis=0):
    return _f.stack(list(arrays), axis=axis)


def expand_dims(x, /, axis=0):
    return _f.expand_dims(x, axis)


def squeeze(x, /, axis):
    return _f.squeeze(x, axis)


def reshape(x, /, shape, *, copy=None):
    return _f.reshape(x, shape)


def permute_dims(x, /, axes):
    return _operand(x, "permute_dims").transpose(tuple(axes))


def moveaxis(x, source, destination, /):
    x = _operand(x, "moveaxis")
    src = normalize_axis_tuple(source, x.ndim, "source")  # (numpy's AxisError and repeated-axis ValueError)
    dst = normalize_axis_tuple(destination, x.ndim, "destination")
    if len(src) != len(dst):
        raise ValueError(f"moveaxis: source {source!r} and destination {destination!r} must name as many axes")
    order = [a for a in range(x.ndim) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return x.transpose(tuple(order))


def broadcast_to(x, /, shape):
    """``x`` broadcast to ``shape`` (a where over a true condition of that shape: exact
    for every value, no arithmetic on it)."""
    x = _operand(x, "broadcast_to")
    shape = _shape(shape)
    try:
        if tuple(np.broadcast_shapes(x.shape, shape)) != shape:
            raise ValueError
    except ValueError:
        raise ValueError(f"broadcast_to: shape {x.shape} cannot be broadcast to {shape}") from None
    if x.shape == shape:
        return x
    return _f.where(full(shape, True, dtype=bool), x, x)


def broadcast_arrays(*arrays):
    shape = tuple(np.broadcast_shapes(*[a.shape for a in arrays]))
    return [broadcast_to(a, shape) for a in arrays]


# -- linear algebra ---------------------------------------------------------------
def matmul(x1, x2, /):
    return _matmul(x1, x2)


def tensordot(x1, x2, /, *, axes=2):
    return _tensordot(x1, x2, axes=axes)


def matrix_transpose(x, /):
    return _operand(x, "matrix_transpose").mT


def vecdot(x1, x2, /, *, axis=-1):
    """``sum(conj(x1) * x2, axis)`` with broadcasting: an einsum over ``axis`` (the
    dtype the operands promote to), the other axes broadcast."""
    x1, x2 = _operand(x1, "vecdot x1"), _operand(x2, "vecdot x2")
    if not (-builtins.min(x1.ndim, x2.ndim) <= axis < 0):
        raise ValueError(f"vecdot: axis {axis} must be negative and within both ranks ({x1.ndim}, {x2.ndim})")
    if x1.shape[axis] != x2.shape[axis]:
        raise ValueError(f"vecdot: axis {axis} has extent {x1.shape[axis]} in x1 and {x2.shape[axis]} in x2")
    try:
        np.broadcast_shapes(x1.shape, x2.shape)
    except ValueError:
        raise ValueError(f"vecdot: shapes {x1.shape} and {x2.shape} do not broadcast") from None
    a, b = moveaxis(x1.conj(), axis, -1), moveaxis(x2, axis, -1)
    return td_einsum("...i,...i->...", a, b)


def take(x, indices, /, *, axis=None):
    """The elements at ``indices`` (1-d ints) along ``axis`` (may be None for a 1-d ``x``)."""
    x = _array(x, "take")
    if axis is None and x.ndim != 1:
        raise ValueError(f"take: axis is required for an array of rank {x.ndim}")
    idx = np.asarray(indices.__array__() if isinstance(indices, Array) else indices)
    if idx.ndim != 1:
        raise ValueError(f"take: indices must be 1-d, got shape {idx.shape}")
    return _f.take(x, idx, 0 if axis is None else axis)


def flip(x, /, *, axis=None):
    return _f.flip(_array(x, "flip"), axis)


def roll(x, /, shift, *, axis=None):
    return _f.roll(_array(x, "roll"), shift, axis)


def repeat(x, repeats, /, *, axis=None):
    r = repeats.__array__() if isinstance(repeats, Array) else repeats
    return _f.repeat(_array(x, "repeat"), r, axis)


def tile(x, repetitions, /):
    return _f.tile(_array(x, "tile"), repetitions)


def tril(x, /, *, k=0):
    """The elements on and below diagonal ``k`` of the last two axes, zeros above."""
    return _f.tril(_array(x, "tril"), k)


def triu(x, /, *, k=0):
    """The elements on and above diagonal ``k`` of the last two axes, zeros below."""
    return _f.triu(_array(x, "triu"), k)


def unstack(x, /, *, axis=0):
    """The arrays along ``axis`` (each a take of one index)."""
    x = _operand(x, "unstack")
    a = _f._axis(axis, x.ndim, "unstack")
    return tuple(x[(slice(None),) * a + (i,)] for i in range(x.shape[a]))


def meshgrid(*arrays, indexing="xy"):
    """Coordinate arrays of 1-d ``arrays`` (each broadcast: no data made twice here)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    xs = [_operand(a, "meshgrid") for a in arrays]
    n = len(xs)
    shape = [x.shape[0] for x in xs]
    if indexing == "xy" and n >= 2:
        shape[0], shape[1] = shape[1], shape[0]
    out = []
    for i, x in enumerate(xs):
        pos = (1 if i == 0 else 0 if i == 1 else i) if indexing == "xy" and n >= 2 else i
        out.append(broadcast_to(_f.reshape(x, tuple(-1 if d == pos else 1 for d in range(n))), tuple(shape)))
    return out


def count_nonzero(x, /, *, axis=None, keepdims=False):
    return sum(_operand(x, "count_nonzero") != 0, axis=axis, keepdims=keepdims, dtype=int64)


# what `from tra_dask.frontend.array_api import *` (tra_dask.array_api) passes on: the
# standard's names, not this module's imports
__all__ = sorted(n for n, v in dict(globals()).items() if (not n.startswith("_") or n.startswith("__array_"))
                 and n not in {"annotations", "builtins", "math", "np", "td_einsum", "Array", "DEVICE",
                               "from_array", "from_region"} and getattr(v, "__module__", __name__) != "__future__")
