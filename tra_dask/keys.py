"""Key functions and predicates: a small symbolic language over keys.

TRA's rekey and filter take functions of a key (paper §3.1).  Written symbolically,
the optimizer can reason about them: which key dims they read (R1-5, R1-6), whether a
key map is the identity (R1-3, R1-4, R2-3), how two maps compose (R1-2), and they
evaluate vectorised over all keys of a relation at once.  Plain Python callables are
accepted everywhere and treated as opaque: they are run key by key and no rule that
needs a fact about them fires.

>>> from tra_dask.keys import k0, k1, project
>>> f = key_map(2 * k0 + k1)
>>> f((1, 1)), sorted(f.dims_read)
((3,), [0, 1])
>>> p = (k0 == k1) & (k0 < 3)
>>> p((2, 2)), p((3, 3)), sorted(p.dims_read)
(True, False, [0, 1])
>>> project(1, 0)((4, 5)), project(0, 1).is_identity(2)
((5, 4), True)
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .types import Key, normalize_key

__all__ = [
    "KeyExpr", "Dim", "Const", "BinOp", "k", "k0", "k1", "k2", "k3", "k4", "k5",
    "Predicate", "Compare", "In", "And", "Or", "Not", "Always", "CallablePredicate",
    "KeyFn", "KeyMap", "InsertDim", "CallableKeyFn",
    "key_map", "project", "permute", "identity", "insert_dim",
    "as_key_fn", "as_predicate",
]

# ---------------------------------------------------------------------------
# integer expressions over a key

_ARITH = {
    "+": (operator.add, np.add),
    "-": (operator.sub, np.subtract),
    "*": (operator.mul, np.multiply),
    "//": (operator.floordiv, np.floor_divide),
    "%": (operator.mod, np.mod),
}
_CMP = {
    "==": (operator.eq, np.equal),
    "!=": (operator.ne, np.not_equal),
    "<": (operator.lt, np.less),
    "<=": (operator.le, np.less_equal),
    ">": (operator.gt, np.greater),
    ">=": (operator.ge, np.greater_equal),
}


def _expr(v) -> "KeyExpr":
    if isinstance(v, KeyExpr):
        return v
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return Const(int(v))
    raise TypeError(f"key expressions combine key dims and ints, got {v!r} ({type(v).__name__})")


class KeyExpr:
    """An integer-valued expression of a key's dims.  ``==``, ``<``, ... build
    :class:`Compare` predicates (as in SQLAlchemy or polars); structural identity is
    :attr:`token`."""

    __slots__ = ()

    # subclasses define: token, dims_read, evaluate(keys), substitute(exprs)
    def __call__(self, key: Key) -> int:
        return int(self.evaluate(np.asarray([key], dtype=np.int64).reshape(1, -1))[0])

    def __hash__(self) -> int:
        return hash(self.token)

    def __bool__(self):
        raise TypeError("a key expression has no truth value; compare it to build a predicate")

    def _bin(self, op, other, swap=False):
        a, b = (_expr(other), self) if swap else (self, _expr(other))
        return BinOp(op, a, b)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __floordiv__(self, o): return self._bin("//", o)
    def __mod__(self, o): return self._bin("%", o)
    def __neg__(self): return BinOp("-", Const(0), self)

    def isin(self, values) -> "In":
        """The predicate "this expression's value is one of ``values``"."""
        return In(self, values)

    def __eq__(self, o): return Compare("==", self, _expr(o))  # type: ignore[override]
    def __ne__(self, o): return Compare("!=", self, _expr(o))  # type: ignore[override]
    def __lt__(self, o): return Compare("<", self, _expr(o))
    def __le__(self, o): return Compare("<=", self, _expr(o))
    def __gt__(self, o): return Compare(">", self, _expr(o))
    def __ge__(self, o): return Compare(">=", self, _expr(o))


@dataclass(frozen=True, eq=False, repr=False)
class Dim(KeyExpr):
    """Key dim ``i``."""

    i: int

    def __post_init__(self):
        if isinstance(self.i, bool) or not isinstance(self.i, (int, np.integer)) or self.i < 0:
            raise ValueError(f"key dim must be a non-negative int, got {self.i!r}")
        object.__setattr__(self, "i", int(self.i))

    @property
    def token(self):
        return ("dim", self.i)

    @property
    def dims_read(self) -> frozenset[int]:
        return frozenset({self.i})

    def evaluate(self, keys: np.ndarray) -> np.ndarray:
        return keys[:, self.i]

    def substitute(self, exprs) -> KeyExpr:
        return exprs[self.i]

    def __repr__(self):
        return f"k{self.i}"


_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, eq=False, repr=False)
class Const(KeyExpr):
    value: int

    def __post_init__(self):
        if not _INT64[0] <= self.value <= _INT64[1]:
            raise ValueError(f"key constant {self.value} does not fit in int64; key values are below 2**63")

    @property
    def token(self):
        return ("const", self.value)

    @property
    def dims_read(self) -> frozenset[int]:
        return frozenset()

    def evaluate(self, keys: np.ndarray) -> np.ndarray:
        return np.full(len(keys), self.value, dtype=np.int64)

    def substitute(self, exprs) -> KeyExpr:
        return self

    def __repr__(self):
        return str(self.value)


@dataclass(frozen=True, eq=False, repr=False)
class BinOp(KeyExpr):
    op: str
    a: KeyExpr
    b: KeyExpr

    def __post_init__(self):
        if self.op not in _ARITH:
            raise ValueError(f"unknown key operator {self.op!r}; valid: {sorted(_ARITH)}")
        if self.op in ("//", "%") and isinstance(self.b, Const) and self.b.value == 0:
            raise ValueError(f"key expression {self.a!r} {self.op} 0 divides by zero")

    @property
    def token(self):
        return ("bin", self.op, self.a.token, self.b.token)

    @property
    def dims_read(self) -> frozenset[int]:
        return self.a.dims_read | self.b.dims_read

    def evaluate(self, keys: np.ndarray) -> np.ndarray:
        a, b = self.a.evaluate(keys), self.b.evaluate(keys)
        if self.op in ("//", "%") and np.any(np.asarray(b) == 0):
            raise ValueError(f"key expression {self!r} divides by zero for some key")
        with np.errstate(over="ignore"):
            out = _ARITH[self.op][1](a, b)
        if self.op in ("+", "-", "*") and _overflowed(self.op, a, b, out):
            raise ValueError(f"key expression {self!r} overflows int64 for some key; key values are below 2**63")
        return out

    def substitute(self, exprs) -> KeyExpr:
        return BinOp(self.op, self.a.substitute(exprs), self.b.substitute(exprs))

    def __repr__(self):
        if self.op == "*" and isinstance(self.a, Const):
            return f"{self.a!r}*{self.b!r}"
        return f"({self.a!r} {self.op} {self.b!r})"


def _overflowed(op: str, a, b, out) -> bool:
    """Whether int64 ``a op b`` wrapped around for some element (numpy does not say)."""
    a, b, out = np.asarray(a), np.asarray(b), np.asarray(out)
    if op == "+":  # same signs in, another sign out
        return bool(np.any(((a >= 0) == (b >= 0)) & ((out >= 0) != (a >= 0))))
    if op == "-":  # different signs in, not the sign of a out
        return bool(np.any(((a >= 0) != (b >= 0)) & ((out >= 0) != (a >= 0))))
    big = (np.abs(a.astype(np.float64)) * np.abs(b.astype(np.float64))) >= 2.0**62
    if not np.any(big):
        return False
    aa, bb, oo = np.broadcast_arrays(a, b, out)
    m = big if big.shape == oo.shape else np.broadcast_to(big, oo.shape)
    return any(int(x) * int(y) != int(z) for x, y, z in zip(aa[m].tolist(), bb[m].tolist(), oo[m].tolist()))


class _DimFactory:
    """``k[i]`` is key dim ``i``."""

    def __getitem__(self, i: int) -> Dim:
        return Dim(i)

    def __repr__(self):
        return "k"


k = _DimFactory()
k0, k1, k2, k3, k4, k5 = (Dim(i) for i in range(6))

# ---------------------------------------------------------------------------
# predicates


class Predicate:
    """A boolean function of a key.  Combine with ``&``, ``|`` and ``~``."""

    __slots__ = ()

    def __call__(self, key: Key) -> bool:
        return bool(self.evaluate(np.asarray([key], dtype=np.int64).reshape(1, -1))[0])

    def __and__(self, o): return And((self, as_predicate(o)))
    def __rand__(self, o): return And((as_predicate(o), self))
    def __or__(self, o): return Or((self, as_predicate(o)))
    def __ror__(self, o): return Or((as_predicate(o), self))
    def __invert__(self): return Not(self)

    def __eq__(self, o):
        return isinstance(o, Predicate) and self.token == o.token

    def __hash__(self):
        return hash(self.token)

    @property
    def is_opaque(self) -> bool:
        return self.dims_read is None


@dataclass(frozen=True, eq=False, repr=False)
class Compare(Predicate):
    op: str
    a: KeyExpr
    b: KeyExpr

    def __post_init__(self):
        if self.op not in _CMP:
            raise ValueError(f"unknown comparison {self.op!r}; valid: {sorted(_CMP)}")

    @property
    def token(self):
        return ("cmp", self.op, self.a.token, self.b.token)

    @property
    def dims_read(self):
        return self.a.dims_read | self.b.dims_read

    def evaluate(self, keys):
        return _CMP[self.op][1](self.a.evaluate(keys), self.b.evaluate(keys))

    def substitute(self, exprs):
        return Compare(self.op, self.a.substitute(exprs), self.b.substitute(exprs))

    def __repr__(self):
        return f"{self.a!r} {self.op} {self.b!r}"


@dataclass(frozen=True, eq=False, repr=False)
class In(Predicate):
    """``expr`` is one of ``values`` (sorted, distinct ints): one predicate for a set
    of key values however many (a chain of ``==`` ``|`` would be as deep as the set)."""

    expr: KeyExpr
    values: tuple

    def __post_init__(self):
        object.__setattr__(self, "values", tuple(sorted({int(v) for v in self.values})))

    @property
    def token(self):
        return ("in", self.expr.token, self.values)

    @property
    def dims_read(self):
        return self.expr.dims_read

    def evaluate(self, keys):
        return np.isin(self.expr.evaluate(keys), np.asarray(self.values, dtype=np.int64))

    def substitute(self, exprs):
        return In(self.expr.substitute(exprs), self.values)

    def __repr__(self):
        vals = ", ".join(map(str, self.values[:4])) + (", ..." if len(self.values) > 4 else "")
        return f"{self.expr!r} in {{{vals}}}"


def _union_dims(parts):
    out = frozenset()
    for p in parts:
        if p.dims_read is None:
            return None
        out |= p.dims_read
    return out


@dataclass(frozen=True, eq=False, repr=False)
class And(Predicate):
    parts: tuple

    @property
    def token(self):
        return ("and",) + tuple(p.token for p in self.parts)

    @property
    def dims_read(self):
        return _union_dims(self.parts)

    def evaluate(self, keys):
        out = np.ones(len(keys), dtype=bool)
        for p in self.parts:
            out &= p.evaluate(keys)
        return out

    def substitute(self, exprs):
        return And(tuple(p.substitute(exprs) for p in self.parts))

    def __repr__(self):
        return " & ".join(f"({p!r})" for p in self.parts)


@dataclass(frozen=True, eq=False, repr=False)
class Or(Predicate):
    parts: tuple

    @property
    def token(self):
        return ("or",) + tuple(p.token for p in self.parts)

    @property
    def dims_read(self):
        return _union_dims(self.parts)

    def evaluate(self, keys):
        out = np.zeros(len(keys), dtype=bool)
        for p in self.parts:
            out |= p.evaluate(keys)
        return out

    def substitute(self, exprs):
        return Or(tuple(p.substitute(exprs) for p in self.parts))

    def __repr__(self):
        return " | ".join(f"({p!r})" for p in self.parts)


@dataclass(frozen=True, eq=False, repr=False)
class Not(Predicate):
    p: Predicate

    @property
    def token(self):
        return ("not", self.p.token)

    @property
    def dims_read(self):
        return self.p.dims_read

    def evaluate(self, keys):
        return ~self.p.evaluate(keys)

    def substitute(self, exprs):
        return Not(self.p.substitute(exprs))

    def __repr__(self):
        return f"~({self.p!r})"


@dataclass(frozen=True, eq=False, repr=False)
class Always(Predicate):
    value: bool = True

    @property
    def token(self):
        return ("always", self.value)

    @property
    def dims_read(self):
        return frozenset()

    def evaluate(self, keys):
        return np.full(len(keys), self.value, dtype=bool)

    def substitute(self, exprs):
        return self

    def __repr__(self):
        return repr(self.value)


@dataclass(frozen=True, eq=False, repr=False)
class CallablePredicate(Predicate):
    """An opaque Python predicate ``fn(key_tuple) -> bool``: nothing is known about
    which dims it reads, so no rule that needs that fires."""

    fn: Callable[[Key], Any]

    @property
    def token(self):
        return ("callable", self.fn)

    dims_read = None

    def evaluate(self, keys):
        out = np.empty(len(keys), dtype=bool)
        for i, row in enumerate(keys.tolist()):
            v = _call_user(self, tuple(row))
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(
                    f"predicate {self!r} returned {v!r} ({type(v).__name__}) for key "
                    f"{tuple(row)}; a predicate must return a bool"
                )
            out[i] = bool(v)
        return out

    def substitute(self, exprs):
        return CallablePredicate(lambda key, f=self.fn, e=tuple(exprs): f(tuple(x(key) for x in e)))

    def __repr__(self):
        return f"<predicate {getattr(self.fn, '__qualname__', repr(self.fn))}>"


def as_predicate(spec) -> Predicate:
    """A :class:`Predicate` from a predicate, a bool or a plain callable."""
    if isinstance(spec, Predicate):
        return spec
    if isinstance(spec, (bool, np.bool_)):
        return Always(bool(spec))
    if isinstance(spec, KeyExpr):
        raise TypeError(f"{spec!r} is a key expression, not a predicate; compare it (e.g. {spec!r} == 0)")
    if callable(spec):
        return CallablePredicate(spec)
    raise TypeError(f"a filter predicate must be a Predicate (e.g. k0 == k1) or a callable, got {spec!r}")


# ---------------------------------------------------------------------------
# key functions


class KeyFn:
    """A function from a key to ``multiplicity`` keys (1 for rekey; m for the
    paper's multi-map, e.g. ``insertDim``)."""

    __slots__ = ()
    multiplicity: int = 1

    def __eq__(self, o):
        return isinstance(o, KeyFn) and self.token == o.token

    def __hash__(self):
        return hash(self.token)

    @property
    def is_opaque(self) -> bool:
        return self.dims_read is None

    def __call__(self, key: Key):
        key = normalize_key(key)
        out, _ = self.apply(np.asarray([key], dtype=np.int64).reshape(1, len(key)))
        keys = [tuple(r) for r in out.tolist()]
        return keys[0] if self.multiplicity == 1 else keys

    def is_identity(self, arity: int) -> bool:
        return False

    def apply_sorted(self, keys: np.ndarray):
        """:meth:`apply`'s pairs in an order that may save the caller a sort (the
        same set of pairs; :class:`InsertDim` sorts them)."""
        return self.apply(keys)


@dataclass(frozen=True, eq=False, repr=False)
class KeyMap(KeyFn):
    """``key -> (e_0(key), e_1(key), ...)``: projection, permutation, affine maps."""

    exprs: tuple

    def __post_init__(self):
        object.__setattr__(self, "exprs", tuple(_expr(e) for e in self.exprs))

    @property
    def token(self):
        return ("keymap",) + tuple(e.token for e in self.exprs)

    @property
    def dims_read(self) -> frozenset[int]:
        out = frozenset()
        for e in self.exprs:
            out |= e.dims_read
        return out

    def out_arity(self, in_arity: int) -> int:
        return len(self.exprs)

    def is_identity(self, arity: int) -> bool:
        return len(self.exprs) == arity and all(isinstance(e, Dim) and e.i == i for i, e in enumerate(self.exprs))

    @property
    def projection(self) -> tuple[int, ...] | None:
        """The dims this map picks, when it only picks dims (projection/permutation)."""
        if all(isinstance(e, Dim) for e in self.exprs):
            return tuple(e.i for e in self.exprs)
        return None

    def apply(self, keys: np.ndarray):
        n = len(keys)
        if not self.exprs:
            return np.zeros((n, 0), dtype=np.int64), np.arange(n)
        cols = [np.broadcast_to(e.evaluate(keys), (n,)) for e in self.exprs]
        return np.stack(cols, axis=1).astype(np.int64, copy=False), np.arange(n)

    def compose(self, inner: "KeyMap") -> "KeyMap":
        """``self ∘ inner``: substitute ``inner``'s expressions for the dims."""
        return KeyMap(tuple(e.substitute(inner.exprs) for e in self.exprs))

    def __repr__(self):
        return "key(" + ", ".join(repr(e) for e in self.exprs) + ")"


@dataclass(frozen=True, eq=False, repr=False)
class InsertDim(KeyFn):
    """The paper's ``insertDim(pos, count)`` (§5.2.2): every key becomes ``count``
    keys with a new dim at ``pos`` taking the values ``0..count-1``.

    >>> InsertDim(2, 2)((1, 0))
    [(1, 0, 0), (1, 0, 1)]
    """

    pos: int
    count: int

    def __post_init__(self):
        for name in ("pos", "count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"insert_dim: {name} must be an int, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.count < 1:
            raise ValueError(f"insert_dim: count must be >= 1, got {self.count}")
        if self.pos < 0:
            raise ValueError(f"insert_dim: position must be >= 0, got {self.pos}")

    @property
    def multiplicity(self) -> int:  # type: ignore[override]
        return self.count

    @property
    def token(self):
        return ("insert_dim", self.pos, self.count)

    @property
    def dims_read(self) -> frozenset[int]:
        return frozenset()  # the new keys copy the old dims; no dim decides anything

    def out_arity(self, in_arity: int) -> int:
        if self.pos > in_arity:
            raise ValueError(
                f"insert_dim({self.pos}, {self.count}) needs keys of arity >= {self.pos}, "
                f"got arity {in_arity} (valid positions: 0..{in_arity})"
            )
        return in_arity + 1

    def apply(self, keys: np.ndarray):
        n, a = keys.shape
        self.out_arity(a)
        c, p = self.count, self.pos
        # written column by column through a (row, copy, dim) view: no (n*count, arity)
        # gathers and no concatenation (the 3-D multiply's replicas are 10^7 keys)
        out = np.empty((n * c, a + 1), dtype=np.result_type(keys.dtype, np.int64))
        grid = out.reshape(n, c, a + 1)  # input row r's copies are rows r*c .. r*c + c - 1
        grid[:, :, p] = np.arange(c)
        for j in range(a):
            grid[:, :, j + (j >= p)] = keys[:, j, None]
        return out, np.repeat(np.arange(n), c)

    def apply_sorted(self, keys: np.ndarray):
        """:meth:`apply`'s ``(keys, rows)`` in another order: for sorted, distinct
        ``keys`` (a relation's) the result is sorted, so its type needs no sort.  Within
        each run of keys equal on the dims before ``pos``, the new dim varies slowest."""
        n, a = keys.shape
        c, p = self.count, self.pos
        if p >= a or n <= 1 or c == 1:  # apply's order (each key's copies in turn) is sorted
            return self.apply(keys)
        self.out_arity(a)
        starts, sizes = _prefix_runs(keys, p)
        out = np.empty((n * c, a + 1), dtype=np.result_type(keys.dtype, np.int64))
        if len(starts) == 1:  # one run (pos 0): all keys with new value 0, then all with 1, ...
            grid = out.reshape(c, n, a + 1)
            grid[:, :, p] = np.arange(c)[:, None]
            for j in range(a):
                grid[:, :, j + (j >= p)] = keys[:, j]
            return out, np.tile(np.arange(n), c)
        run = np.repeat(np.arange(len(starts)), c * sizes)
        off = np.arange(n * c) - (c * starts)[run]  # position within the run's c * size outputs
        m = sizes[run]
        rows = starts[run] + off % m
        out[:, p] = off // m
        for j in range(a):
            out[:, j + (j >= p)] = keys[:, j][rows]
        return out, rows

    def sorted_rows(self, keys: np.ndarray) -> np.ndarray:
        """For sorted, distinct ``keys``: the row of each of :meth:`apply`'s keys
        among its sorted keys (the output relation's rows), by arithmetic instead of
        a lookup — key ``(r, v)`` (copy ``v`` of row ``r``, in run ``[s, s + m)``)
        is row ``c·s + v·m + (r - s)``."""
        n, a = keys.shape
        c, p = self.count, self.pos
        if p >= a or n <= 1 or c == 1:
            return np.arange(n * c, dtype=np.int32 if n * c < 2**31 - 1 else np.int64)
        starts, sizes = _prefix_runs(keys, p)
        s = np.repeat(starts, sizes)
        m = np.repeat(sizes, sizes)
        base = (c - 1) * s + np.arange(n)  # c·s + (r - s)
        return (base[:, None] + m[:, None] * np.arange(c)).reshape(-1)

    def __repr__(self):
        return f"insert_dim({self.pos}, {self.count})"


def _prefix_runs(keys: np.ndarray, p: int):
    """``(starts, sizes)`` of the runs of consecutive rows equal on dims ``< p`` (of
    sorted keys: the groups of equal prefixes)."""
    n = len(keys)
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for j in range(p):
        new[1:] |= keys[1:, j] != keys[:-1, j]
    starts = np.flatnonzero(new)
    return starts, np.diff(np.append(starts, n))


@dataclass(frozen=True, eq=False, repr=False)
class CallableKeyFn(KeyFn):
    """An opaque key function ``fn(key_tuple) -> key_tuple | int``."""

    fn: Callable[[Key], Any]

    @property
    def token(self):
        return ("callable", self.fn)

    dims_read = None

    def out_arity(self, in_arity: int) -> int:
        key = (0,) * in_arity
        return len(normalize_key(_call_user(self, key), where=f"key function {self!r} at key {key}"))

    def apply(self, keys: np.ndarray):
        where = f"key function {self!r}"
        out = [normalize_key(_call_user(self, r), where=f"{where} at key {r}") for r in map(tuple, keys.tolist())]
        arities = {len(o) for o in out}
        if len(arities) > 1:
            raise ValueError(f"{where} returned keys of different arities {sorted(arities)}")
        arity = arities.pop() if out else self.out_arity(keys.shape[1])
        return np.array(out, dtype=np.int64).reshape(len(out), arity), np.arange(len(out))

    def __repr__(self):
        return f"<key function {getattr(self.fn, '__qualname__', repr(self.fn))}>"


def _call_user(f, key: Key):
    """``f.fn(key)`` for an opaque key function or predicate ``f``; an exception from the
    user's code (an IndexError for a dim the key does not have, a ZeroDivisionError)
    becomes a ValueError naming the function and the key (a TypeError stays one)."""
    try:
        return f.fn(key)
    except Exception as e:
        cls = TypeError if isinstance(e, TypeError) else ValueError
        raise cls(f"{f!r} raised {type(e).__name__}: {e} for key {key}") from e


def key_map(*exprs) -> KeyMap:
    """A key map from expressions (or ints): ``key_map(2*k0 + k1)``."""
    if len(exprs) == 1 and isinstance(exprs[0], (tuple, list)):
        exprs = tuple(exprs[0])
    return KeyMap(tuple(exprs))


def project(*dims: int) -> KeyMap:
    """Keep ``dims`` in this order (a projection; a permutation when all dims)."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    return KeyMap(tuple(Dim(int(d)) for d in dims))


permute = project


def identity(arity: int) -> KeyMap:
    return project(*range(arity))


def insert_dim(pos: int, count: int) -> InsertDim:
    return InsertDim(pos, count)


def as_key_fn(spec) -> KeyFn:
    """A :class:`KeyFn` from a key function, one expression, a tuple of expressions
    and ints, or a plain callable (opaque)."""
    if isinstance(spec, KeyFn):
        return spec
    if isinstance(spec, KeyExpr):
        return KeyMap((spec,))
    if isinstance(spec, (tuple, list)):
        return KeyMap(tuple(spec))
    if isinstance(spec, Predicate):
        raise TypeError(f"{spec!r} is a predicate, not a key function; did you mean filter()?")
    if callable(spec):
        return CallableKeyFn(spec)
    raise TypeError(
        f"a key function must be a KeyFn, a key expression such as 2*k0 + k1, a tuple of "
        f"them, or a callable key -> key; got {spec!r}"
    )
