"""``td.Array``: a lazy n-d array over the tensor relational algebra.

Write numpy: ``A @ B``, ``td.einsum("bhqd,bhkd->bhqk", q, k)``, ``(x - y).sum(axis=1)``
over numpy arrays, dask arrays, TRA relations and other ``td.Array``s.  Nothing runs
and no chunking is fixed until a result is asked for: then the chunking is chosen
with the plan (:mod:`.chunking`), the expression becomes a TRA relation
(:mod:`.build`), and the optimizer's plan runs on the cluster
(``x.compute()``, ``x.to_dask_array()``) or in this process (``td.to_numpy(x)``).

Every check that can fail does so here, when the expression is written: shapes
that do not broadcast, einsum indices of two extents, ufuncs no kernel implements,
ordering complex numbers (``max``, ``<``, ``argmin``: they have no order here).

Arrays are bool, integer, floating or complex.  An axis may have extent 0 (a numpy
or dask input): every result over an empty array is known from shapes alone (empty,
zeros for a sum over an empty index, NaN for a mean, numpy's error for max/min), so
it is made here, before any planning, and only non-empty results are planned.
"""

from __future__ import annotations

import numbers
import operator

import numpy as np

from .chunk_ops import BINARY_OPS, ORDERED, UNARY_UFUNCS, full_region, ufunc_kernel
from .chunking import check_chunking
from .einsum import check_optimize, interleaved, parse, symbol
from .nodes import (ArgReduce, Cumsum, Einsum, Elementwise, Expand, Leaf, Permute, Reduce, ScalarOp, Slice, Take,
                    Unary)

__all__ = ["Array", "from_array", "from_region", "asarray", "einsum", "matmul", "tensordot", "dot", "vdot",
           "outer"]

_UNARY_UFUNCS = {np.exp: "exp", np.log: "log", np.negative: "neg", np.absolute: "abs", np.sqrt: "sqrt",
                 np.tanh: "tanh", np.conjugate: "conj"}
_UNARY_UFUNCS.update({getattr(np, n): n for n in UNARY_UFUNCS})
_BINARY_UFUNCS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div",
                  np.maximum: "max", np.minimum: "min", np.power: "pow", np.greater: "gt",
                  np.greater_equal: "ge", np.less: "lt", np.less_equal: "le", np.equal: "eq", np.not_equal: "ne"}
_BINARY_UFUNCS.update({f: n for n, f in BINARY_OPS.items() if f not in _BINARY_UFUNCS})
_NAME = {"add": "+", "sub": "-", "mul": "*", "div": "/", "max": "maximum", "min": "minimum", "pow": "**",
         "gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!=", "floor_divide": "//",
         "remainder": "%", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "left_shift": "<<",
         "right_shift": ">>"}
DEVICE = "tra_dask"  # the one device of the Array API namespace: wherever the plan puts the chunks


def _is_scalar(v) -> bool:
    return isinstance(v, (numbers.Number, np.generic)) and not isinstance(v, (bool, np.bool_))


def _filled(shape, dtype, value=None) -> "Array":
    """An array known from shapes alone: an empty one (an axis of extent 0: numpy's
    result, held here, nothing to plan), or ``value`` everywhere (a sum over an empty
    axis: zeros; made where the plan puts it, like a ``from_region`` array)."""
    shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
    label = f"{'x'.join(map(str, shape)) or 'scalar'} {dtype}"
    if 0 in shape:
        return Array(Leaf(shape, dtype, data=np.empty(shape, dtype), kind="numpy", name=f"empty[{label}]"))
    v = np.asarray(0 if value is None else value, dtype=dtype)[()]
    if not shape:
        return Array(Leaf(shape, dtype, data=np.asarray(v), kind="numpy", name=f"{v!r}"))
    return Array(Leaf(shape, dtype, data=full_region(v), kind="function", name=f"full[{label} {v!r}]"))


def _refuse_complex(where: str, *dtypes):
    """Ordering ops (maximum, minimum, <, max, argmin, relu, ...) on complex values:
    numpy orders them lexicographically; here they are refused, naming the op."""
    bad = [np.dtype(d) for d in dtypes if np.dtype(d).kind == "c"]
    if bad:
        raise TypeError(f"{where}: not defined for complex numbers ({bad[0]}): they have no order; compare "
                        f"x.real, x.imag or abs(x) instead")


def _is_dask(x) -> bool:
    return type(x).__module__.startswith("dask.array") and hasattr(x, "chunks")


def _is_index_array(i) -> bool:
    """An integer or boolean array (or list) used as an index."""
    if isinstance(i, Array):
        raise TypeError("td.Array indexing by a td.Array is not supported (the result's shape would depend on "
                        "data not computed yet); index by a numpy array, or use td.where for a mask")
    return isinstance(i, (list, np.ndarray)) or (hasattr(i, "__array__") and not np.isscalar(i))


def regular_chunks(chunks) -> tuple:
    """A block size per axis from dask-style chunks, None where they are irregular."""
    out = []
    for c in chunks:
        c = tuple(int(v) for v in c)
        regular = len(c) == 1 or (len(set(c[:-1])) == 1 and c[-1] <= c[0])
        out.append(c[0] if regular and c else None)
    return tuple(out)


def from_array(x, chunks=None, name: str | None = None) -> "Array":
    """A :class:`Array` over ``x``: a numpy or cupy array (chunks chosen with the plan
    unless ``chunks`` is given: an int or a block size per axis), a dask array (its
    chunks and placement kept unless re-chunking is cheaper), a TRA relation whose
    keys form the chunk grid of one tensor, a submission's futures, or anything
    ``numpy.asarray`` takes."""
    if isinstance(x, Array):
        return x
    if hasattr(x, "__tra_relation__") and not isinstance(x, Relation):
        x = x.__tra_relation__()
    if isinstance(x, Relation):
        return Array(_relation_leaf(x, name))
    if _is_dask(x):
        x = _plain_dask(x, name)
        if any(n != n for n in x.shape):  # NaN: chunk sizes dask does not know yet
            raise ValueError(f"from_array: the dask array {x.name[:24]} has unknown chunk sizes {x.chunks}; "
                             f"call x.compute_chunk_sizes() first")
        shape = _check_leaf("from_array", x.shape, x.dtype, empty=True)
        if 0 in shape:  # nothing to hold: numpy's empty array
            return _filled(shape, x.dtype)
        if chunks is not None:
            x = x.rechunk(chunks)
        return Array(Leaf(shape, np.dtype(x.dtype), data=x, kind="dask",
                          chunks=regular_chunks(x.chunks), name=name or f"dask[{x.name[:16]}]"))
    if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "__getitem__")):
        try:
            x = np.asarray(x)
        except (TypeError, ValueError) as e:  # a ragged list, ...
            raise ValueError(f"from_array: {type(x).__name__} is not an array ({e})") from None
    x = host_array(x, f"from_array({name})" if name else "from_array")
    shape = _check_leaf("from_array", x.shape, x.dtype, empty=True)
    if 0 in shape:
        return _filled(shape, x.dtype)
    fixed = None
    if chunks is not None:
        fixed = normalize_chunks(chunks, shape, where=f"from_array {name or ''}".rstrip()) if shape else ()
        fixed = tuple(min(int(b), n) for b, n in zip(fixed, shape))  # a block is at most the extent
    label = name or f"array[{'x'.join(map(str, shape)) or 'scalar'} {x.dtype}]"
    return Array(Leaf(shape, np.dtype(x.dtype), data=x, kind="numpy", chunks=fixed, name=label))


def _plain_dask(x, name):
    """A dask input as its chunks must be: not masked (refused), in the machine's byte
    order (converted lazily, by dask)."""
    where = f"from_array({name or 'dask[' + x.name[:16] + ']'})"
    if isinstance(getattr(x, "_meta", None), np.ma.MaskedArray):
        refuse_masked(where, "dask")
    native = native_dtype(x.dtype)
    return x if native is None else x.astype(native)


def _check_leaf(where: str, shape, dtype, empty: bool = False) -> tuple:
    """An array input's shape as ints (:func:`tra_dask.types.check_extents`; an
    axis of extent 0 only with ``empty``: a numpy or dask array may have one, a
    ``from_region`` array may not), and a dtype the array kernels compute in (bool,
    integer, floating or complex: numpy, dask and region inputs alike)."""
    if empty and isinstance(shape, (tuple, list)):
        zero = [d for d, n in enumerate(shape) if isinstance(n, (int, np.integer)) and
                not isinstance(n, (bool, np.bool_)) and n == 0]
        shape = list(check_extents(tuple(1 if d in zero else n for d, n in enumerate(shape)), where))
        shape = tuple(0 if d in zero else n for d, n in enumerate(shape))
    else:
        shape = check_extents(shape, where)
    if np.dtype(dtype).kind not in "biufc":
        raise TypeError(f"{where}: dtype {np.dtype(dtype)} is not supported; use bool, integer, floating or "
                        f"complex arrays")
    return shape


def from_region(fn, shape, dtype, chunks="auto", name: str | None = None) -> "Array":
    """An :class:`Array` made on the workers: ``fn(region)`` returns the values of
    ``region`` (a tuple of slices, one per axis) as an array of that region's shape.
    Each chunk is made on the site the plan puts it (nothing passes through the
    client), and the chunking is chosen with the plan (``chunks="auto"``, or None)
    unless ``chunks`` is given (an int or a block size per axis) — so ``fn``'s values must not depend on how the
    array is cut: what it returns for a region is that region of one array.  On a
    cluster ``fn`` travels to the workers as Dask sends functions (cloudpickle: a
    lambda works; a module-level function is imported there, so its module must be
    importable on the workers).  What it returns is checked there: the region's
    shape, and a dtype that casts to ``dtype`` without changing kind.

    >>> import tra_dask as td
    >>> x = from_region(lambda r: np.add.outer(*(np.arange(s.start, s.stop) for s in r)), (3, 4), "int64")
    >>> td.to_numpy(x.sum(axis=0))
    array([ 3,  6,  9, 12])
    """
    where = f"from_region {name or getattr(fn, '__name__', '')}".rstrip()
    if not callable(fn):
        raise TypeError(f"{where}: fn must be callable (a tuple of slices -> the array of that region), got {fn!r}")
    dtype = np.dtype(dtype)
    shape = _check_leaf(where, shape, dtype)
    fixed = None
    if chunks is not None and not (isinstance(chunks, str) and chunks == "auto"):
        fixed = normalize_chunks(chunks, shape, where=where) if shape else ()
        fixed = tuple(min(int(b), n) for b, n in zip(fixed, shape))
    label = name or f"{getattr(fn, '__name__', type(fn).__name__)}[{'x'.join(map(str, shape)) or 'scalar'} {dtype}]"
    return Array(Leaf(shape, dtype, data=fn, kind="function", chunks=fixed, name=label))


def _relation_leaf(rel, name):
    t = rel.type
    where = f"from_array({rel.label})"
    if t.arity != t.rank or not t.is_continuous:
        raise ValueError(
            f"{where}: a relation is an array when its keys form one tensor's chunk grid (key arity == "
            f"chunk rank, no holes); this one has key arity {t.arity}, chunk rank {t.rank}"
        )
    extents = t.grid_extents()
    shape = tuple(int(sum(e)) for e in extents)
    chunks = tuple(int(e[0]) for e in extents)
    for d, e in enumerate(extents):
        if any(v != e[0] for v in e[:-1]) or e[-1] > e[0]:
            raise ValueError(f"{where}: its chunks along axis {d} have extents {list(e)}; only the last may be "
                             f"smaller than the others")
    return Leaf(shape, np.dtype(t.dtype), data=rel, kind="relation", chunks=chunks, name=name or rel.label)


def asarray(x) -> "Array":
    return from_array(x)


def _operand(x, where: str) -> "Array":
    if isinstance(x, Array):
        return x
    try:
        return from_array(x)
    except (TypeError, ValueError) as e:  # the same kind of error, saying which operand
        kind = f"{type(x).__module__.split('.')[0]}.{type(x).__name__}"
        raise type(e)(f"{where}: cannot use this {kind} as an array operand ({e})") from None


class Array:
    """A lazy array: an expression over data, with ``shape``, ``dtype``, ``ndim``.

    ``.relation`` is the TRA expression (for one site), ``.plan()`` the plan with
    the chunking chosen for a cluster, ``.compute()`` numpy, ``.to_dask_array()``.
    """

    __slots__ = ("_node",)
    __array_priority__ = 50

    def __init__(self, node):
        if not isinstance(node, Leaf):
            check_chunking(node)  # chunks fixed by the data must fit: say so now, not when it runs
        self._node = node

    # -- metadata -----------------------------------------------------------
    shape = property(lambda self: self._node.shape)
    dtype = property(lambda self: self._node.dtype)
    ndim = property(lambda self: len(self._node.shape))
    size = property(lambda self: int(np.prod(self._node.shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    @property
    def chunks(self):
        """Dask-style chunks when the data fixes them (a leaf with chunks), else
        None: they are chosen with the plan (``x.plan().explain()`` says how)."""
        n = self._node
        if isinstance(n, Leaf) and n.chunks is not None and None not in n.chunks:
            return tuple(tuple([b] * (s // b) + ([s % b] if s % b else [])) for s, b in zip(n.shape, n.chunks))
        return None

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self):
        return f"td.Array<shape={self.shape}, dtype={self.dtype}, {type(self._node).__name__.lower()}>"

    def __hash__(self):
        return id(self)

    def _scalar(self, kind: str):
        """The one element of a size-1 array as a Python ``kind`` (``bool(x)``,
        ``float(x)``, ``int(x)``, ``complex(x)``, ``operator.index(x)``): it is computed
        then (on the current Dask client if there is one, else here), as numpy's
        conversions read the element; an array of more elements is refused, as
        numpy refuses it, before anything runs."""
        if self.size != 1:
            raise TypeError(f"td.Array: {kind}() of an array of shape {self.shape} ({self.size} elements); only a "
                            f"one-element array converts to a Python scalar (reduce it first: x.any(), x.all(), "
                            f"x.sum(), ...)")
        if kind == "index" and self.dtype.kind not in "iu":
            raise TypeError(f"td.Array: only integer arrays are an index, this one is {self.dtype}")
        return np.asarray(self).reshape(())[()]

    def __bool__(self): return bool(self._scalar("bool"))
    def __float__(self): return float(self._scalar("float"))
    def __int__(self): return int(self._scalar("int"))
    def __complex__(self): return complex(self._scalar("complex"))
    def __index__(self): return int(self._scalar("index"))

    def __setitem__(self, key, value):
        raise TypeError("td.Array is immutable (a lazy expression): build the new array instead, e.g. "
                        "td.where(mask, value, x)")

    def __eq__(self, o): return self._binary(o, "eq")  # noqa: E704  (elementwise, as numpy's)
    def __ne__(self, o): return self._binary(o, "ne")  # noqa: E704
    def __gt__(self, o): return self._binary(o, "gt")
    def __ge__(self, o): return self._binary(o, "ge")
    def __lt__(self, o): return self._binary(o, "lt")
    def __le__(self, o): return self._binary(o, "le")

    # -- elementwise ----------------------------------------------------------
    def _binary(self, other, op, reflected=False):
        where = f"td.Array {_NAME.get(op, 'numpy.' + op)}"
        if _is_scalar(other):
            if op in ORDERED:
                _refuse_complex(where, self.dtype, np.asarray(other).dtype)
            try:
                node = _scalar_node(self._node, op, other, reflected)
            except TypeError as e:  # numpy's own refusal (bitwise ops of floats, ...)
                raise TypeError(f"{where}: not defined for {self.dtype} and {type(other).__name__} ({e})") from None
            return _filled(node.shape, node.dtype) if self.size == 0 else Array(node)
        other = _operand(other, where)
        a, b = (other, self) if reflected else (self, other)
        try:
            shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        except ValueError:
            raise ValueError(f"{where}: shapes {a.shape} and {b.shape} do not broadcast together "
                             f"(numpy rules: aligned from the right, equal or 1)") from None
        if op in ORDERED:
            _refuse_complex(where, a.dtype, b.dtype)
        try:
            with np.errstate(all="ignore"):
                dtype = BINARY_OPS[op](np.ones(1, a.dtype), np.ones(1, b.dtype)).dtype
        except TypeError as e:  # numpy's own refusal (bitwise ops of floats, ...)
            raise TypeError(f"{where}: not defined for {a.dtype} and {b.dtype} ({e})") from None
        if a.size == 0 or b.size == 0:
            return _filled(shape, dtype)
        return Array(Elementwise(shape, dtype, inputs=(a._node, b._node), op=op))

    def __add__(self, o): return self._binary(o, "add")
    def __radd__(self, o): return self._binary(o, "add", True)
    def __sub__(self, o): return self._binary(o, "sub")
    def __rsub__(self, o): return self._binary(o, "sub", True)
    def __mul__(self, o): return self._binary(o, "mul")
    def __rmul__(self, o): return self._binary(o, "mul", True)
    def __truediv__(self, o): return self._binary(o, "div")
    def __rtruediv__(self, o): return self._binary(o, "div", True)

    def __pow__(self, o):
        if self.dtype == np.bool_ and type(o) in (int, np.int64, np.int32) and o == 2:
            return self.astype(np.int8)._binary(o, "pow")  # numpy's ** 2 is its square: int8 for bools
        return self._binary(o, "pow")
    def __rpow__(self, o): return self._binary(o, "pow", True)

    def __floordiv__(self, o): return self._binary(o, "floor_divide")
    def __rfloordiv__(self, o): return self._binary(o, "floor_divide", True)
    def __mod__(self, o): return self._binary(o, "remainder")
    def __rmod__(self, o): return self._binary(o, "remainder", True)
    def __and__(self, o): return self._binary(o, "bitwise_and")
    def __rand__(self, o): return self._binary(o, "bitwise_and", True)
    def __or__(self, o): return self._binary(o, "bitwise_or")
    def __ror__(self, o): return self._binary(o, "bitwise_or", True)
    def __xor__(self, o): return self._binary(o, "bitwise_xor")
    def __rxor__(self, o): return self._binary(o, "bitwise_xor", True)
    def __lshift__(self, o): return self._binary(o, "left_shift")
    def __rlshift__(self, o): return self._binary(o, "left_shift", True)
    def __rshift__(self, o): return self._binary(o, "right_shift")
    def __rrshift__(self, o): return self._binary(o, "right_shift", True)

    def __neg__(self): return self._unary("neg")
    def __abs__(self): return self._unary("abs")
    def __pos__(self): return self
    def __invert__(self): return self._unary("invert")

    def _unary(self, name):
        """A unary elementwise op: a registered kernel or one of numpy's unary ufuncs
        (:data:`~.chunk_ops.UNARY_UFUNCS`), with numpy's dtype (its refusals as TypeErrors)."""
        if name == "relu":
            _refuse_complex("td.Array relu (numpy.maximum(x, 0))", self.dtype)
        kernel = ufunc_kernel(name) if name in UNARY_UFUNCS else get_kernel(name)
        try:
            t = kernel.out_type(ArrayType((1,) * max(self.ndim, 1), self.dtype))
        except KernelTypeError as e:
            raise TypeError(f"td.Array: numpy.{name} is not defined for {self.dtype} ({e})") from None
        if self.size == 0:
            return _filled(self.shape, t.dtype)
        return Array(Unary(self.shape, t.dtype, inputs=(self._node,), kernel=name))

    def astype(self, dtype, copy=True):
        """``ndarray.astype``: a cast (numpy's unsafe casting) to a bool, integer,
        floating or complex ``dtype``; the array itself when it has that dtype."""
        try:
            dtype = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"td.Array.astype: {dtype!r} is not a dtype ({e})") from None
        if dtype.kind not in "biufc":
            raise TypeError(f"td.Array.astype: dtype {dtype} is not supported; use bool, integer, floating or "
                            f"complex")
        if dtype == self.dtype:
            return self
        if self.size == 0:
            return _filled(self.shape, dtype)
        return Array(Unary(self.shape, dtype, inputs=(self._node,), kernel="astype"))

    def conj(self):
        """``numpy.conj``: the complex conjugate (the array itself for real dtypes)."""
        return self._unary("conj") if self.dtype.kind == "c" else self

    conjugate = conj

    @property
    def real(self):
        """The real part (the array itself for real dtypes, as numpy's ``x.real``)."""
        return self._unary("real") if self.dtype.kind == "c" else self

    @property
    def imag(self):
        """The imaginary part (zeros of the array's dtype for real dtypes, as numpy's)."""
        if self.dtype.kind == "c":
            return self._unary("imag")
        return _filled(self.shape, self.dtype, 0)

    def __matmul__(self, o): return matmul(self, o)
    def __rmatmul__(self, o): return matmul(o, self)

    def dot(self, b, out=None):
        """``numpy.ndarray.dot``: :func:`dot` of this array and ``b`` (no ``out=``)."""
        if out is not None:
            raise TypeError("td.Array.dot: out= is not supported (a td.Array is lazy; use the result)")
        return dot(self, b)

    # -- reductions -----------------------------------------------------------
    def _axes(self, axis, where, single: bool = False) -> tuple:
        """``axis`` (None, an int or a tuple of ints; one int where ``single``) as sorted
        axes in range, or numpy's errors naming ``where``: a TypeError for what is not
        an integer, an AxisError (a ValueError) for an axis out of range."""
        if axis is None:
            return tuple(range(self.ndim))
        axes = tuple(axis) if isinstance(axis, (tuple, list)) and not single else (axis,)
        out = []
        for a in axes:
            try:
                if isinstance(a, (bool, np.bool_)):
                    raise TypeError
                a = operator.index(a)
            except TypeError:
                raise TypeError(f"{where}: axis {a!r}: '{type(a).__name__}' object cannot be interpreted as an "
                                f"integer; an axis is an int{'' if single else ' or a tuple of ints'}") from None
            if not -self.ndim <= a < self.ndim:
                raise np.exceptions.AxisError(f"{where}: axis {a!r} is out of range for an array of shape "
                                              f"{self.shape}; valid axes: {-self.ndim}..{self.ndim - 1}")
            out.append(int(a) % self.ndim)
        if len(set(out)) != len(out):
            raise ValueError(f"{where}: axis {axis!r} repeats an axis")
        return tuple(sorted(out))

    def _whole(self, axis):
        """``axis``, or None for numpy's reductions' axis 0 or -1 (an int, not a
        tuple) of a 0-d array: the whole of it."""
        if self.ndim == 0 and not isinstance(axis, (bool, np.bool_, tuple, list)):
            try:
                if operator.index(axis) in (0, -1):
                    return None
            except TypeError:
                pass
        return axis

    def _reduce(self, op, axis, keepdims):
        where = f"td.Array.{op}"
        axes = self._axes(self._whole(axis), where)
        if op in ("max", "min"):
            _refuse_complex(where, self.dtype)
        shape = tuple(1 if a in axes else n for a, n in enumerate(self.shape) if keepdims or a not in axes)
        dtype = getattr(np, op)(np.ones((1,) * max(self.ndim, 1), self.dtype)).dtype
        if not axes and dtype == self.dtype:
            return self
        if self.size == 0:
            return self._empty_reduce(where, op, axes, shape, dtype)
        return Array(Reduce(shape, dtype, inputs=(self._node,), op=op, axes=axes, keepdims=bool(keepdims)))

    def _empty_reduce(self, where, op, axes, shape, dtype):
        """A reduction of an empty array, from shapes alone: numpy's value of the op
        over no elements (0 for sum, NaN for mean, with numpy's warning; its error
        for max and min) where a reduced axis is empty, else an empty result."""
        empty = [a for a in axes if self.shape[a] == 0]
        if not empty:  # (then a kept axis is empty, and so is the result)
            return _filled(shape, dtype)
        try:  # (numpy refuses max/min of an empty axis even when the result is empty too)
            value = getattr(np, op)(np.empty(0, self.dtype))
        except ValueError as e:  # max/min: no identity
            raise ValueError(f"{where}: {e} (axis {empty[0]} of shape {self.shape} is empty)") from None
        return _filled(shape, dtype, value)

    def sum(self, axis=None, keepdims=False):
        return self._reduce("sum", axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return self._reduce("max", axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return self._reduce("min", axis, keepdims)

    def prod(self, axis=None, keepdims=False):
        """``numpy.prod``: per chunk, then the partial products multiplied (an aggregation by ``mul``)."""
        return self._reduce("prod", axis, keepdims)

    def any(self, axis=None, keepdims=False):
        """``numpy.any``: per chunk, then or-ed (an aggregation by ``max`` of booleans)."""
        return self._reduce("any", axis, keepdims)

    def all(self, axis=None, keepdims=False):
        """``numpy.all``: per chunk, then and-ed (an aggregation by ``min`` of booleans)."""
        return self._reduce("all", axis, keepdims)

    def var(self, axis=None, ddof=0, keepdims=False):
        """``numpy.var``: the mean of ``abs(x - x.mean(axis, keepdims=True))**2`` times
        ``n / (n - ddof)``, two passes as numpy's (integers in float64)."""
        from .functions import var

        return var(self, axis=axis, ddof=ddof, keepdims=keepdims, label="td.Array.var")

    def std(self, axis=None, ddof=0, keepdims=False):
        """``numpy.std``: the square root of :meth:`var`."""
        from .functions import var

        return np.sqrt(var(self, axis=axis, ddof=ddof, keepdims=keepdims, label="td.Array.std"))

    def cumsum(self, axis=None, dtype=None):
        """``numpy.cumsum``: running sums along ``axis`` (None: of the flattened array,
        numpy's order), in numpy's dtype (small integers and bools as the platform
        integer) or ``dtype``.  Within each chunk, plus the totals of the chunks before
        it along ``axis`` (a join of the chunk totals on the other key dims, filtered
        to the blocks before, aggregated)."""
        x = self.reshape(-1) if axis is None else self
        if axis is None:
            axis = 0
        if x.ndim == 0:
            x = x.reshape(1)
        (a,) = x._axes(axis, "td.Array.cumsum", single=True)
        out = np.cumsum(np.ones(1, x.dtype), dtype=dtype).dtype
        if out.kind not in "biufc":
            raise TypeError(f"td.Array.cumsum: dtype {out} is not supported")
        if x.size == 0:
            return _filled(x.shape, out)
        return Array(Cumsum(x.shape, out, inputs=(x._node,), axis=a))

    def mean(self, axis=None, keepdims=False):
        axes = self._axes(axis, "td.Array.mean")
        n = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        if self.size == 0 and axes:
            dtype = np.mean(np.ones(1, self.dtype)).dtype
            shape = tuple(1 if a in axes else m for a, m in enumerate(self.shape) if keepdims or a not in axes)
            return self._empty_reduce("td.Array.mean", "mean", axes, shape, dtype)
        # numpy's accumulator: float64 for bools and integers (an int64 sum of large values
        # would wrap), float32 for float16 (whose sum overflows at 65504); the result in
        # float16 again for float16
        acc = np.float64 if self.dtype.kind in "biu" else np.float32 if self.dtype == np.float16 else None
        x = self.astype(acc) if acc is not None else self
        s = x.sum(axis=axes, keepdims=keepdims) if axes else x
        m = s * (1.0 / n) if s.dtype.kind == "f" else s / n
        return m.astype(np.float16) if self.dtype == np.float16 else m

    def _arg(self, op, axis):
        where = f"td.Array.arg{op}"
        axis = self._whole(axis)
        if axis is None:  # the flat index: of the array reshaped to one axis
            if self.ndim != 1:
                return self.reshape(-1)._arg(op, 0)
            axis = 0
        (a,) = self._axes(axis, where, single=True)
        _refuse_complex(where, self.dtype)
        shape = tuple(n for d, n in enumerate(self.shape) if d != a)
        if self.shape[a] == 0:
            raise ValueError(f"{where}: attempt to get arg{op} of an empty sequence (axis {a} of shape "
                             f"{self.shape} is empty)")
        if self.size == 0:
            return _filled(shape, np.int64)
        return Array(ArgReduce(shape, np.dtype(np.int64), inputs=(self._node,), op=op, axis=a))

    def argmin(self, axis=None):
        return self._arg("min", axis)

    def argmax(self, axis=None):
        return self._arg("max", axis)

    # -- shape ----------------------------------------------------------------
    def transpose(self, *axes):
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]  # x.transpose(None), x.transpose((1, 0)); x.transpose(()) is the empty permutation
        elif not axes:
            axes = None  # x.transpose(): reversed
        if axes is not None and any(isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer))
                                    or not -self.ndim <= a < self.ndim for a in axes):
            raise ValueError(f"td.Array.transpose: axes {axes!r} out of range for an array of rank {self.ndim}; "
                             f"valid axes: {-self.ndim}..{self.ndim - 1}")
        perm = tuple(range(self.ndim))[::-1] if axes is None else tuple(int(a) % max(self.ndim, 1) for a in axes)
        if sorted(perm) != list(range(self.ndim)):
            raise ValueError(f"td.Array.transpose: axes {axes!r} are not a permutation of 0..{self.ndim - 1}")
        if self.size == 0:
            return _filled(tuple(self.shape[p] for p in perm), self.dtype)
        return Array(Permute(tuple(self.shape[p] for p in perm), self.dtype, inputs=(self._node,), perm=perm))

    T = property(lambda self: self.transpose())

    @property
    def mT(self):
        """The last two axes swapped (the Array API's ``matrix_transpose``)."""
        if self.ndim < 2:
            raise ValueError(f"td.Array.mT: needs at least 2 dims, got shape {self.shape}")
        return self.transpose(tuple(range(self.ndim - 2)) + (self.ndim - 1, self.ndim - 2))

    def reshape(self, *shape, order="C"):
        """``numpy.reshape`` in C order (one ``-1`` allowed): axes kept as they are
        stay cut as they are (a rekey); axes merged or split are kept in one block each
        (each chunk reshaped on its own), which the chunking then respects."""
        from .functions import reshape

        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return reshape(self, shape, order=order)

    def ravel(self):
        """``numpy.ravel``: ``reshape(-1)`` (the whole array one block along the result)."""
        return self.reshape(-1)

    flatten = ravel

    def squeeze(self, axis=None):
        """``numpy.squeeze``: the axes of extent 1 (``axis``: those, each of extent 1) dropped."""
        from .functions import squeeze

        return squeeze(self, axis)

    def _expand(self, positions):
        positions = tuple(sorted(positions))
        shape = list(self.shape)
        for p in positions:
            shape.insert(p, 1)
        if self.size == 0:
            return _filled(shape, self.dtype)
        if not positions:
            return self
        return Array(Expand(tuple(shape), self.dtype, inputs=(self._node,), positions=positions))

    def __getitem__(self, index):
        """Integers, slices (any step; where one does not keep whole blocks it is a
        re-cut the plan places and costs), ``None`` (``numpy.newaxis``: a new axis of
        extent 1) and ``...``."""
        if not isinstance(index, tuple):
            index = (index,)
        arrays = [k for k, i in enumerate(index) if _is_index_array(i)]
        if arrays:
            return self._fancy(index, arrays)
        if sum(i is Ellipsis for i in index) > 1:
            raise IndexError("td.Array: an index can only have a single ellipsis ('...')")
        real = sum(i is not None and i is not Ellipsis for i in index)
        if any(i is Ellipsis for i in index):
            k = index.index(Ellipsis)
            index = index[:k] + (slice(None),) * max(0, self.ndim - real) + index[k + 1:]
        new, o = [], 0  # the output positions of the new axes
        for i in index:
            if i is None:
                new.append(o)
            if i is None or isinstance(i, slice):
                o += 1
        index = tuple(i for i in index if i is not None)
        if len(index) > self.ndim:
            raise IndexError(f"td.Array: {len(index)} indices (not counting None) for an array of rank {self.ndim}")
        out = self._index(index)
        return out._expand(new) if new else out

    def _fancy(self, index, arrays):
        """One integer or boolean array in an index (numpy's advanced indexing): the
        rest of the index first, then a take along the array's axis; a 1-d boolean
        mask is its ``nonzero``.  With integers beside it but not next to it, the
        taken axis goes first, as numpy puts it."""
        from .functions import take

        if len(arrays) > 1 or any(i is None for i in index):
            raise IndexError("td.Array: one integer or boolean array per index, without None (numpy's other "
                             "advanced indexing is not supported)")
        (k,) = arrays
        if sum(i is Ellipsis for i in index) > 1:
            raise IndexError("td.Array: an index can only have a single ellipsis ('...')")
        if any(i is Ellipsis for i in index):  # (positions by identity: == on an array is elementwise)
            e = next(p for p, i in enumerate(index) if i is Ellipsis)
            fill = (slice(None),) * max(0, self.ndim - (len(index) - 1))
            index = index[:e] + fill + index[e + 1:]
            k = k if k < e else k - 1 + len(fill)
        if len(index) > self.ndim:
            raise IndexError(f"td.Array: {len(index)} indices for an array of rank {self.ndim}")
        idx = index[k] if isinstance(index[k], np.ndarray) else np.asarray(index[k])
        if idx.dtype == bool:
            if idx.ndim != 1 or len(idx) != self.shape[k]:
                raise IndexError(f"td.Array: a boolean index must be 1-d and as long as its axis ({self.shape[k]}), "
                                 f"got shape {idx.shape}; for a mask over several axes use td.where")
            idx = np.flatnonzero(idx)
        ints = [a for a, i in enumerate(index) if isinstance(i, (int, np.integer)) and not isinstance(i, bool)]
        rest = self[index[:k] + (slice(None),) + index[k + 1:]]
        axis = k - sum(a < k for a in ints)
        out = take(rest, idx, axis=axis)
        advanced = sorted(ints + [k])
        if ints and advanced[-1] - advanced[0] + 1 != len(advanced):  # numpy: the array's axes first
            moved = list(range(axis, axis + idx.ndim))
            out = out.transpose(moved + [a for a in range(out.ndim) if a not in moved])
        return out

    def _index(self, index):
        bounds, takes = [], []
        for a, n in enumerate(self.shape):
            s = index[a] if a < len(index) else slice(None)
            if isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)):
                if not -n <= s < n:
                    raise IndexError(f"td.Array: index {s} is out of bounds for axis {a} with extent {n}")
                takes.append((a, int(s) % n))
                s = slice(None)
            if not isinstance(s, slice):
                raise TypeError(f"td.Array indexing supports integers, slices, None, ... and one integer or "
                                f"boolean array only; got {s!r} for axis {a}")
            start, stop, step = s.indices(n)
            bounds.append((start, step, len(range(start, stop, step))))
        shape = tuple(m for _, _, m in bounds)
        if 0 in shape or self.size == 0:  # an empty slice, or a slice of an empty array: numpy's empty result
            return _filled(tuple(m for d, m in enumerate(shape) if d not in dict(takes)), self.dtype)
        whole = all((start, step, m) == (0, 1, n) for (start, step, m), n in zip(bounds, self.shape))
        out = self if whole else Array(Slice(shape, self.dtype, inputs=(self._node,),
                                             bounds=tuple((start, step) for start, step, _ in bounds)))
        for a, i in reversed(takes):  # last axis first: the earlier axes keep their numbers
            node = out._node
            out = Array(Take(tuple(m for d, m in enumerate(node.shape) if d != a), node.dtype, inputs=(node,),
                             axis=a, index=i))
        return out

    # -- numpy protocols ---------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        out = _run.cluster_api().compute_local_or_cluster(self)
        return out.astype(dtype) if dtype is not None else out

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs.get("out") is not None:
            raise TypeError(f"td.Array supports numpy.{ufunc.__name__} as a plain call only (no {method}, no out=)")
        if kwargs:
            raise TypeError(f"td.Array: numpy.{ufunc.__name__} keyword arguments {sorted(kwargs)} are not supported")
        if ufunc in _UNARY_UFUNCS:
            return _operand(inputs[0], f"numpy.{ufunc.__name__}")._unary(_UNARY_UFUNCS[ufunc])
        if ufunc in _BINARY_UFUNCS and len(inputs) != 2:  # (numpy would have refused: a guard)
            raise TypeError(f"numpy.{ufunc.__name__} takes 2 operands, got {len(inputs)}")
        if ufunc is np.matmul:
            return matmul(*inputs)
        if ufunc in _BINARY_UFUNCS:
            op = _BINARY_UFUNCS[ufunc]
            a, b = inputs
            if op == "max" and isinstance(a, Array) and type(b) in (int, float) and b == 0 and a.dtype.kind == "f":
                return a._unary("relu")
            if isinstance(a, Array):
                return a._binary(b, op)
            if not isinstance(b, Array):  # a td.Array in out=, or a subclass: numpy's other operand types
                raise TypeError(f"td.Array: numpy.{ufunc.__name__} of {type(a).__name__} and {type(b).__name__}")
            return b._binary(a, op, reflected=True)
        supported = sorted(f.__name__ for f in [*_UNARY_UFUNCS, *_BINARY_UFUNCS, np.matmul])
        raise TypeError(f"td.Array does not support numpy.{ufunc.__name__}; supported ufuncs: {', '.join(supported)}")

    def __array_function__(self, func, types, args, kwargs):
        impl = _FUNCTIONS.get(func)
        if impl is None:
            raise TypeError(f"td.Array does not support numpy.{func.__name__}; supported: "
                            f"{', '.join(sorted('numpy.' + f.__name__ for f in _FUNCTIONS))}")
        return impl(*args, **kwargs)

    # -- the Array API -----------------------------------------------------------------
    def __array_namespace__(self, api_version=None):
        """:mod:`tra_dask.array_api`, the Array API functions the library expresses."""
        array_api = _run.namespace()

        if api_version is not None and api_version not in array_api.SUPPORTED_VERSIONS:
            raise ValueError(f"td.Array: Array API version {api_version!r} is not supported; supported: "
                             f"{', '.join(array_api.SUPPORTED_VERSIONS)}")
        return array_api

    @property
    def device(self):
        """One device: wherever the plan puts the chunks (``"tra_dask"``)."""
        return DEVICE

    def to_device(self, device, /, stream=None):
        if device != DEVICE:
            raise ValueError(f"td.Array.to_device: the only device is {DEVICE!r}, got {device!r}")
        return self

    # -- results --------------------------------------------------------------------
    @property
    def relation(self):
        """The TRA expression of this array, chunked as for one site (the chunking a
        cluster gets comes with :meth:`plan`)."""
        return _run.build_local(self, sites=1)[0]

    def to_relation(self, sites: int = 1, memory_limit=None, cluster=None):
        """``(relation, plan)``: the TRA expression with the chunking chosen for
        ``sites`` sites of the default cluster description (``memory_limit``: bytes
        per site), or for the sites of ``cluster`` (a :class:`~tra_dask.ClusterSpec`,
        e.g. ``ClusterSpec.load`` of a calibration), and its plan."""
        return _run.build_local(self, sites=sites, memory_limit=memory_limit, cluster=cluster)

    def plan(self, client=None, sites=None, **kw):
        """The plan :meth:`compute` runs (chunking included; ``plan.explain()``): costed
        with the results' way to the client, and remembered, so that :meth:`compute`
        after it plans nothing again (:func:`tra_dask.api.plan` gives the plan ``td.submit`` runs)."""
        return _run.cluster_api().plan(self, client=client, sites=sites, gathers="array", **kw)

    def compute(self, client=None, sites=None, **kw):
        """Run on the cluster (the current Dask client, else the embedded one) and
        return a numpy array."""
        return _run.cluster_api().compute(self, client=client, sites=sites, **kw)

    def to_dask_array(self, client=None, sites=None, **kw):
        """Run on the cluster and return a dask array backed by the result's futures
        (an empty array: a dask array of numpy's empty array; nothing runs)."""
        if self.size == 0:
            import dask.array as da

            return da.from_array(np.empty(self.shape, self.dtype))
        return _run.cluster_api().submit(self, client=client, sites=sites, **kw).to_dask_array()



def _scalar_node(x, op, c, reflected):
    one = np.ones(1, x.dtype)
    f = BINARY_OPS[op]
    with np.errstate(all="ignore"):  # only the dtype is wanted (1 / 0 is fine)
        dtype = (f(c, one) if reflected else f(one, c)).dtype
    return ScalarOp(x.shape, dtype, inputs=(x,), op=op, value=c, reflected=bool(reflected))


# ---------------------------------------------------------------------------
# einsum and friends


_CASTING = ("no", "equiv", "safe", "same_kind", "unsafe")


def _einsum_dtype(where: str, ops, dtype, casting, order, view: bool = False):
    """The result dtype of an einsum, checked as numpy checks ``dtype=``, ``casting=``
    and ``order=``: every operand must cast to the result dtype (``dtype``, else the
    operands' promotion) under ``casting`` (numpy's default for einsum: 'safe').
    ``view``: one operand and no summed index (a transpose, a diagonal), which numpy
    returns as a view of its operand: ``dtype`` and ``casting`` are then ignored, as
    numpy ignores them."""
    if not isinstance(casting, str):
        raise TypeError(f"{where}: casting must be a str, one of {', '.join(map(repr, _CASTING))}; got {casting!r}")
    if casting not in _CASTING:
        raise ValueError(f"{where}: casting must be one of {', '.join(map(repr, _CASTING))} (got {casting!r})")
    if order is not None and (not isinstance(order, str) or order.upper() not in ("K", "A", "C", "F")):
        raise ValueError(f"{where}: order must be one of 'C', 'F', 'A', or 'K' (got {order!r}); the result is "
                         f"assembled in C order whichever is given")
    if dtype is None:
        result = np.result_type(*[x.dtype for x in ops])
    else:
        try:
            result = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"{where}: dtype={dtype!r} is not a dtype ({e})") from None
        if result.kind not in "biufc":
            raise TypeError(f"{where}: dtype={result} is not supported; an einsum computes in a bool, integer, "
                            f"floating or complex dtype")
    if view:
        return np.dtype(ops[0].dtype)
    for i, x in enumerate(ops):
        if not np.can_cast(x.dtype, result, casting=casting):
            raise TypeError(f"{where}: operand {i} ({x.dtype}) cannot be cast to {result} under casting={casting!r}"
                            + (" (numpy's default for einsum: pass casting='same_kind' or 'unsafe' to allow it)"
                               if casting == "safe" else ""))
    return np.dtype(result)


def einsum(subscripts, *operands, chunks="auto", optimize="auto", dtype=None, casting="safe",
           order="K") -> Array:
    """``numpy.einsum`` over arrays of any kind, as a lazy :class:`Array`.

    ``subscripts`` as numpy takes them: a string (``"ij,jk->ik"``, ``...``, implicit
    output), or the interleaved form ``einsum(a, [0, 1], b, [1, 2], [0, 2])``
    (sublists of ints in 0..51 and ``Ellipsis``; the output sublist optional).
    ``chunks``: ``"auto"`` (the optimizer chooses a block size per index with the
    plan), an int (every index cut in blocks of that size) or ``{index: block}``.
    ``optimize``: ``"auto"`` or True (candidate contraction orders from opt_einsum,
    the one with the least predicted time kept), False (left to right, as
    written), an opt_einsum strategy name, or a path (opt_einsum's, or numpy's
    ``["einsum_path", (0, 1), ...]``).
    ``dtype``, ``casting``: numpy's — the result dtype (the operands cast to it and
    summed in it), each operand checked to cast to it under ``casting`` (``'no'``,
    ``'equiv'``, ``'safe'`` (the default, as numpy's), ``'same_kind'``, ``'unsafe'``);
    as in numpy, both are ignored for one operand and no summed index (numpy returns
    a view of the operand there: a transpose or a diagonal keeps its dtype).
    ``order``: ``'K'``, ``'A'``, ``'C'`` or ``'F'`` is accepted, and the result is
    assembled in C order whichever is given (a td.Array has no memory layout until
    it is computed).  An operand with an empty axis gives numpy's result from shapes
    alone: empty, or zeros where the empty index is summed.
    """
    if not isinstance(subscripts, str):
        subscripts, operands = interleaved((subscripts, *operands))
    if not operands:
        raise ValueError("einsum: no operands given")
    ops = [_operand(x, f"einsum({subscripts!r}) operand {i}") for i, x in enumerate(operands)]
    subs, out, sizes = parse(subscripts, [x.shape for x in ops])
    view = len(ops) == 1 and set(subs[0]) <= set(out)
    result = _einsum_dtype(f"einsum {subscripts!r}", ops, dtype, casting, order, view)

    if isinstance(chunks, (int, np.integer)) and not isinstance(chunks, (bool, np.bool_)):
        (block,) = check_extents((chunks,), f"einsum {subscripts!r}", what="chunks")
        given = {c: block for c in sizes}
    elif isinstance(chunks, dict):
        bad = sorted(set(chunks) - set(sizes))
        if bad:
            raise ValueError(f"einsum {subscripts!r}: chunks names index {bad[0]!r}, which is not one of "
                             f"{''.join(sorted(sizes))!r}")
        given = dict(zip(chunks, check_extents(tuple(chunks.values()), f"einsum {subscripts!r}",
                                               what=f"chunks (block sizes of {''.join(chunks)!r})")))
    elif chunks is None or (isinstance(chunks, str) and chunks == "auto"):
        given = {}
    else:
        raise ValueError(f"einsum: chunks must be 'auto', an int or {{index: block size}}, got {chunks!r}")
    return _einsum(ops, subs, out, sizes, given, check_optimize(optimize, len(ops)), dtype=result)


def _einsum(ops, subs, out: str, sizes: dict, given=None, optimize="auto", dtype=None) -> Array:
    """The einsum node of parsed subscripts (one index per axis, of any character);
    ``dtype``: the result's (numpy's promotion of the operands if None).  An empty
    index gives the result from shapes alone (empty, or zeros: an empty sum)."""
    dtype = np.result_type(*[x.dtype for x in ops]) if dtype is None else dtype
    if dtype == np.bool_:
        dtype = np.dtype(np.bool_)
    if 0 in sizes.values():
        return _filled(tuple(sizes[c] for c in out), dtype)
    node = Einsum(tuple(sizes[c] for c in out), np.dtype(dtype), inputs=tuple(x._node for x in ops),
                  subs=tuple(subs), out=out, sizes=tuple(sorted(sizes.items())),
                  chunks=tuple(sorted((given or {}).items())), optimize=optimize)
    return Array(node)


def matmul(a, b) -> Array:
    """``numpy.matmul`` (``a @ b``): 1-d operands promoted, leading dims broadcast."""
    a, b = _operand(a, "matmul operand 0"), _operand(b, "matmul operand 1")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must have at least one dim; got shapes {a.shape} and {b.shape} "
                         f"(use * for scalars)")
    sa = "...ij" if a.ndim >= 2 else "j"
    sb = "...jk" if b.ndim >= 2 else "j"
    so = "..." + ("i" if a.ndim >= 2 else "") + ("k" if b.ndim >= 2 else "")
    if a.shape[-1] != b.shape[-2 if b.ndim >= 2 else 0]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align: the last dim of the first "
                         f"({a.shape[-1]}) must equal the {'second-to-last' if b.ndim >= 2 else 'only'} dim of "
                         f"the second ({b.shape[-2 if b.ndim >= 2 else 0]})")
    return einsum(f"{sa},{sb}->{so}", a, b)


def tensordot(a, b, axes=2) -> Array:
    """``numpy.tensordot``: sum over ``axes`` (an int: the last of ``a`` with the
    first of ``b``; or two sequences of axes)."""
    a, b = _operand(a, "tensordot operand 0"), _operand(b, "tensordot operand 1")
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        if n > min(a.ndim, b.ndim) or n < 0:
            raise ValueError(f"tensordot: axes={n} but the operands have ranks {a.ndim} and {b.ndim}")
        xa, xb = list(range(a.ndim - n, a.ndim)), list(range(n))
    else:
        xa, xb = axes
        xa = [xa] if isinstance(xa, (int, np.integer)) else list(xa)
        xb = [xb] if isinstance(xb, (int, np.integer)) else list(xb)
        if len(xa) != len(xb):
            raise ValueError(f"tensordot: {len(xa)} axes of the first operand but {len(xb)} of the second")
        for which, ax, arr in (("first", xa, a), ("second", xb, b)):
            bad = [x for x in ax if not -arr.ndim <= x < arr.ndim]
            if bad:
                raise ValueError(f"tensordot: axis {bad[0]} is out of range for the {which} operand (rank "
                                 f"{arr.ndim}); valid axes: {-arr.ndim}..{arr.ndim - 1}")
            if len({x % arr.ndim for x in ax}) != len(ax):
                raise ValueError(f"tensordot: the axes {list(ax)} of the {which} operand repeat an axis")
        xa, xb = [x % a.ndim for x in xa], [x % b.ndim for x in xb]
    la = [symbol(d) for d in range(a.ndim)]  # (indices of any number: not limited to 52 letters)
    fresh = iter(range(a.ndim, a.ndim + b.ndim))
    lb = [None] * b.ndim
    for i, j in zip(xa, xb):
        if a.shape[i] != b.shape[j]:
            raise ValueError(f"tensordot: axis {i} of the first operand has extent {a.shape[i]} but axis {j} of "
                             f"the second has {b.shape[j]}")
        lb[j] = la[i]
    lb = [c or symbol(next(fresh)) for c in lb]
    out = [c for d, c in enumerate(la) if d not in xa] + [c for d, c in enumerate(lb) if d not in xb]
    sizes = {**dict(zip(la, a.shape)), **dict(zip(lb, b.shape))}
    return _einsum([a, b], ["".join(la), "".join(lb)], "".join(out), sizes)


def dot(a, b) -> Array:
    """``numpy.dot``: matmul for 2-d, the inner product for 1-d, a scalar product for
    0-d, and the sum over the last axis of ``a`` and the second-to-last of ``b``."""
    a, b = _operand(a, "dot operand 0"), _operand(b, "dot operand 1")
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    if b.ndim == 1:
        return tensordot(a, b, axes=([-1], [0]))
    return tensordot(a, b, axes=([-1], [-2]))


def _np_sum(a, axis=None, dtype=None, out=None, keepdims=False, **kw):
    _no_extras("sum", dtype=dtype, out=out, **kw)
    return _operand(a, "numpy.sum").sum(axis=axis, keepdims=keepdims)


def _np_reduce(name):
    def f(a, axis=None, out=None, keepdims=False, **kw):
        _no_extras(name, out=out, **kw)
        return getattr(_operand(a, f"numpy.{name}"), name)(axis=axis, keepdims=keepdims)
    return f


def _np_arg(name):
    def f(a, axis=None, out=None, **kw):
        _no_extras(name, out=out, **kw)
        return getattr(_operand(a, f"numpy.{name}"), name)(axis=axis)
    return f


def _no_extras(name, **kw):
    bad = sorted(k for k, v in kw.items() if v is not None and v is not np._NoValue)
    if bad:
        raise TypeError(f"td.Array: numpy.{name} with {', '.join(bad)}= is not supported")


def vdot(a, b) -> Array:
    """``numpy.vdot``: the sum of ``conj(a) * b`` over every element (``a`` conjugated
    when complex).  numpy flattens its operands; a td.Array has no reshape, so ``a``
    and ``b`` must have one shape."""
    a, b = _operand(a, "vdot operand 0"), _operand(b, "vdot operand 1")
    if a.shape != b.shape:
        raise ValueError(f"vdot: operands of shapes {a.shape} and {b.shape}; td.vdot needs one shape (numpy "
                         f"flattens both, and a td.Array has no reshape)")
    idx = "".join(symbol(d) for d in range(a.ndim))
    return _einsum([a.conj(), b], [idx, idx], "", dict(zip(idx, a.shape)))


def outer(a, b) -> Array:
    """``numpy.outer`` of two 1-d arrays: ``out[i, j] = a[i] * b[j]`` (numpy flattens
    operands of other ranks; a td.Array has no reshape, so they are refused)."""
    a, b = _operand(a, "outer operand 0"), _operand(b, "outer operand 1")
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"outer: operands of shapes {a.shape} and {b.shape}; td.outer takes 1-d arrays (numpy "
                         f"flattens others, and a td.Array has no reshape)")
    return _einsum([a, b], ["i", "j"], "ij", {"i": a.shape[0], "j": b.shape[0]})


def _np_einsum(*operands, out=None, optimize="auto", dtype=None, order="K", casting="safe", **kw):
    if out is not None:
        raise TypeError("td.Array: numpy.einsum with out= is not supported (a td.Array is lazy; use the result)")
    _no_extras("einsum", **kw)
    return einsum(*operands, optimize=optimize, dtype=dtype, casting=casting, order=order)


def _np_outer(a, b, out=None):
    _no_extras("outer", out=out)
    return outer(a, b)


_FUNCTIONS = {
    np.einsum: _np_einsum,
    np.matmul: matmul,
    np.tensordot: tensordot,
    np.dot: dot,
    np.sum: _np_sum,
    np.max: _np_reduce("max"),
    np.min: _np_reduce("min"),
    np.mean: _np_reduce("mean"),
    np.argmin: _np_arg("argmin"),
    np.argmax: _np_arg("argmax"),
    np.transpose: lambda a, axes=None: _operand(a, "numpy.transpose").transpose(axes),
    np.vdot: vdot,
    np.outer: _np_outer,
    np.real: lambda val: _operand(val, "numpy.real").real,
    np.imag: lambda val: _operand(val, "numpy.imag").imag,
    np.prod: _np_reduce("prod"),
    np.cumsum: lambda a, axis=None, dtype=None, out=None: (_no_extras("cumsum", out=out),
                                                           _operand(a, "numpy.cumsum").cumsum(axis, dtype))[1],
    np.any: _np_reduce("any"),
    np.all: _np_reduce("all"),
}
if hasattr(np, "amax"):
    _FUNCTIONS.setdefault(np.amax, _FUNCTIONS[np.max])
    _FUNCTIONS.setdefault(np.amin, _FUNCTIONS[np.min])

from . import run as _run  # noqa: E402  (run imports this module's Array)
from ..logical.nodes import Relation
from ..logical.sources import host_array, native_dtype, refuse_masked
from ..types import ArrayType, check_extents, normalize_chunks
from ..kernels import KernelTypeError, get_kernel
from . import functions as _functions  # noqa: E402,F401  (adds numpy.where, numpy.concatenate, ... to _FUNCTIONS)
