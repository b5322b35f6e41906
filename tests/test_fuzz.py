"""The fuzz campaign of issue 14 ("Faults never cost a result"), as a test.

Random programs over the public API — sources of random shapes, chunkings and dtypes,
every TRA operator with random (often wrong) dims and sizes, registered, declared and
plain-callable kernels (some raise, some lie about their output), loaders that fail or
return the wrong chunk, key functions and predicates that raise, NaN/inf/negative/
float/str sizes, 0-d arrays — and the numpy-style front-end.  The property: every
input either computes the answer of an independent model (numpy, or the plain
dict-of-chunks model below), or is refused with a ValueError/TypeError naming the
relation when it is built (before any data is touched), or — for faults only running
can show (a kernel that raises or lies, a loader that fails) — fails with the user's
own exception or the documented error naming the kernel or loader.  Never another
exception type, a hang or a silently wrong answer.

The model decides validity on its own (the TRA rules as the README states them), so
a valid program that is refused fails the test as surely as an invalid one that is
accepted.

CI runs a small, reproducible campaign (``derandomize=True``).  A bigger one:
``TRA_FUZZ_EXAMPLES=2000 TRA_FUZZ_SEED=7 pytest tests/test_fuzz.py`` (examples per
in-process test; ``TRA_FUZZ_REPORT=path.json`` writes the counts).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import time
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as _seed
from hypothesis import strategies as st

import tra_dask as td
from tra_dask.keys import insert_dim, k0, k1, project
from tra_dask.logical import check_outputs

EXAMPLES = int(os.environ.get("TRA_FUZZ_EXAMPLES", "0"))  # 0: the CI budget below
SEED = os.environ.get("TRA_FUZZ_SEED")
COUNTS: Counter = Counter()


def fuzz(ci_examples: int, share: float = 1.0):
    """Hypothesis settings: ``ci_examples`` reproducible examples in CI, or ``share``
    of the campaign's ``TRA_FUZZ_EXAMPLES`` with seed ``TRA_FUZZ_SEED``."""
    n = max(ci_examples, int(EXAMPLES * share)) if EXAMPLES else ci_examples
    s = settings(max_examples=n, deadline=None, derandomize=SEED is None, database=None,
                 suppress_health_check=list(HealthCheck), print_blob=True)

    def wrap(f):
        f = s(f)
        return _seed(int(SEED))(f) if SEED is not None else f

    return wrap


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("TRA_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(dict(sorted(COUNTS.items())), f, indent=1)


BOOM = "fuzz-boom"  # what faulty user code raises, in a FloatingPointError (a builtin: it pickles to workers)


def _boom(*_):
    raise FloatingPointError(BOOM)


# ---------------------------------------------------------------------------
# the model: TRA semantics on {key: chunk} dicts, written apart from tra_dask's evaluator


class Invalid(Exception):
    """The model says the step is not a valid TRA program (construction must refuse it)."""


class Fault(Exception):
    """Running the program must fail with ``kind`` (the model found it by running)."""

    def __init__(self, kind, detail=""):
        super().__init__(kind, detail)
        self.kind, self.detail = kind, detail


def _blocks(shape, chunks):
    return [range(-(-n // c)) for n, c in zip(shape, chunks)]


def _cut(arr, chunks):
    out = {}
    for key in itertools.product(*_blocks(arr.shape, chunks)):
        out[key] = arr[tuple(slice(k * c, (k + 1) * c) for k, c in zip(key, chunks))]
    return out


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def model_chunks(chunks, shape):
    """The chunk shape tra_dask must take (dask-like): int for all dims, or one entry
    per dim, each an int >= 1, -1 or None (the whole dim); else Invalid."""
    if _is_int(chunks):
        chunks = (chunks,) * len(shape)
    if not isinstance(chunks, (tuple, list)) or len(chunks) != len(shape):
        raise Invalid("chunks")
    out = []
    for c, n in zip(chunks, shape):
        if c is None or (_is_int(c) and c == -1):
            c = n
        if not _is_int(c) or c < 1:
            raise Invalid("chunk size")
        out.append(int(c))
    return tuple(out)


def model_shape(shape):
    if _is_int(shape):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(_is_int(n) and n >= 1 for n in shape) or len(shape) > 64:
        raise Invalid("shape")
    return tuple(int(n) for n in shape)


def _numeric(dtype):
    return np.dtype(dtype).kind in "biufc"


class KSpec:
    """A kernel as the fuzz uses it: what tra_dask gets (``spec``), the function the
    model runs, and the model's own type rule (``rule(*arrays)``: raises Invalid when
    the kernel's rule refuses these chunks).  ``declared``: "same"/"broadcast" for a
    td.kernel declaration, whose output the model holds it to (else a lie)."""

    def __init__(self, name, spec, fn, rule, declared=None, arity=1):
        self.name, self.spec, self.fn, self.rule, self.declared, self.arity = name, spec, fn, rule, declared, arity

    def check_declared(self, out, *xs):
        """A declared kernel whose output is not what it declared is a lie (only running
        shows it): ``same`` keeps the input type, ``broadcast`` numpy's."""
        if self.declared == "same":
            want = (xs[0].shape, np.result_type(*(x.dtype for x in xs)))
        elif self.declared == "broadcast":
            want = (np.broadcast_shapes(*(x.shape for x in xs)), np.result_type(*(x.dtype for x in xs)))
        else:
            return
        if (out.shape, out.dtype) != want:
            raise Fault("lie")

    def __repr__(self):
        return self.name


def _any(*xs):
    return True


def _rank2(*xs):
    if any(x.ndim != 2 for x in xs):
        raise Invalid("needs 2-d")


def _not_bool(x):
    if x.dtype == np.bool_:
        raise Invalid("bool")


def _bcast(a, b):
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise Invalid("broadcast") from None


def _bcast_not_bool(a, b):
    _bcast(a, b)
    if a.dtype == np.bool_ and b.dtype == np.bool_:
        raise Invalid("bool")


def _mm(a, b):
    _rank2(a, b)
    if a.shape[1] != b.shape[0]:
        raise Invalid("inner dims")


def _probe(fn):
    """A plain callable's rule: it must run on zero chunks of the same shapes."""
    def rule(*xs):
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(fn(*(np.zeros(x.shape, x.dtype) for x in xs)))
        except Exception:
            raise Invalid("probe") from None
        if not _numeric(out.dtype):
            raise Invalid("probe dtype")
    return rule


def _sin(x):
    return np.sin(x)


def _raise_on_data(x):  # passes the dry run on zeros, fails on the data
    if np.any(x != 0):
        raise FloatingPointError(BOOM)
    return x + 0


def _obj(x):
    return np.array([None] * x.size, dtype=object).reshape(x.shape)


def _twice(x):
    return x * 2 + 1


def _liar_shape(x):
    return np.concatenate([x.reshape(-1), x.reshape(-1)])  # declared "same"


def _liar_dtype(x):
    return x.astype(np.float32 if x.dtype != np.float32 else np.float64)


def _bsum(a, b):
    return a + b


_USER = {}


def _user(name, fn, **kw):
    """A td.kernel-declared user kernel, registered once per process."""
    if name not in _USER:
        _USER[name] = td.kernel(fn, name=name, **kw)
    return _USER[name]


def unary_kernels():
    K = KSpec
    return [
        K("neg", "neg", np.negative, _not_bool),
        K("exp", "exp", np.exp, _any),
        K("abs", "abs", np.abs, _any),
        K("identity", "identity", lambda x: x, _any),
        K("transpose", "transpose", lambda x: x.T, _rank2),
        K("diag", "diag", lambda x: x * np.eye(x.shape[0], x.shape[1], dtype=x.dtype), _rank2),
        K("row_sum", "row_sum", lambda x: x.sum(axis=1, keepdims=True), _rank2),
        K("row_max", "row_max", lambda x: x.max(axis=1, keepdims=True), _rank2),
        K("scale(0.5)", td.kernels.scale(0.5), lambda x: x * 0.5, _any),
        K("user same", _user("fuzz_twice", _twice, shape="same"), _twice, _any, "same"),
        K("callable sin", _sin, _sin, _probe(_sin)),
        K("callable always raises", _boom, None, _probe(_boom)),
        K("callable object", _obj, None, _probe(_obj)),
        K("callable raises on data", _raise_on_data, _raise_on_data, _probe(_raise_on_data)),
        K("user raises", _user("fuzz_boom", _boom, shape="same"), _boom, _any, "same"),
        K("user lies shape", _user("fuzz_liar_shape", _liar_shape, shape="same"), _liar_shape, _any, "same"),
        K("user lies dtype", _user("fuzz_liar_dtype", _liar_dtype, shape="same"), _liar_dtype, _any, "same"),
    ]


def binary_kernels():
    K = KSpec
    return [
        K("add", "add", np.add, _bcast, arity=2),
        K("sub", "sub", np.subtract, _bcast_not_bool, arity=2),
        K("mul", "mul", np.multiply, _bcast, arity=2),
        K("max", "max", np.maximum, _bcast, arity=2),
        K("min", "min", np.minimum, _bcast, arity=2),
        K("matmul", "matmul", np.matmul, _mm, arity=2),
        K("user broadcast", _user("fuzz_bsum", _bsum, shape="broadcast"), _bsum, _bcast, "broadcast", arity=2),
    ]


_UNARY = unary_kernels()
_BINARY = binary_kernels()


class MRel:
    """A relation in the model: its chunks, and what tra_dask built for it."""

    def __init__(self, rel, chunks, faulty=None):
        self.rel, self.chunks, self.faulty = rel, chunks, faulty


def m_transform(m: MRel, ks: KSpec):
    shapes = {(a.shape, a.dtype.str): a for a in m.chunks.values()}
    for a in shapes.values():  # the rule decides on chunk types alone, data aside
        ks.rule(np.zeros(a.shape, a.dtype))
    out = {k: _run_kernel(ks, a) for k, a in m.chunks.items()}
    for k, a in m.chunks.items():  # every chunk is made before any is checked (as evaluate does)
        ks.check_declared(out[k], a)
    return out


def _run_kernel(ks, *xs):
    """The user's kernel on the data: whatever it raises is what running must raise."""
    try:
        with np.errstate(all="ignore"):
            return np.asarray(ks.fn(*xs))
    except Exception as e:
        raise Fault("raise", e) from None


def m_join(L: MRel, R: MRel, lo, ro, ks: KSpec):
    la, ra = _arity(L), _arity(R)
    _dims_ok(lo, la)
    _dims_ok(ro, ra)
    if len(lo) != len(ro):
        raise Invalid("lengths")
    for a, b in zip(lo, ro):
        if {k[a] for k in L.chunks} != {k[b] for k in R.chunks}:
            raise Invalid("ranges")
    rest = [d for d in range(ra) if d not in ro]
    pairs = [(lk, lv, rk, rv) for lk, lv in L.chunks.items() for rk, rv in R.chunks.items()
             if all(lk[a] == rk[b] for a, b in zip(lo, ro))]
    for lv, rv in {(lv.shape, lv.dtype.str, rv.shape, rv.dtype.str): (lv, rv) for _, lv, _, rv in pairs}.values():
        ks.rule(np.zeros(lv.shape, lv.dtype), np.zeros(rv.shape, rv.dtype))  # types first: construction
    out = {lk + tuple(rk[d] for d in rest): _run_kernel(ks, lv, rv) for lk, lv, rk, rv in pairs}
    for lk, lv, rk, rv in pairs:  # every chunk is made before any is checked (as evaluate does)
        ks.check_declared(out[lk + tuple(rk[d] for d in rest)], lv, rv)
    return out


def _arity(m: MRel):
    return len(next(iter(m.chunks))) if m.chunks else m.rel.key_arity


def _dims_ok(dims, n):
    if not isinstance(dims, tuple) or any(not _is_int(d) or not 0 <= d < n for d in dims):
        raise Invalid("dims")
    if len(set(dims)) != len(dims):
        raise Invalid("repeated")


def m_aggregate(m: MRel, gb, ks: KSpec):
    _dims_ok(gb, _arity(m))
    groups = defaultdict(list)
    for k in sorted(m.chunks):
        groups[tuple(k[d] for d in gb)].append(m.chunks[k])
    for g, cs in groups.items():
        if len({c.shape for c in cs}) > 1:
            raise Invalid("mixed shapes")
    for a in {(c.shape, c.dtype.str): c for c in m.chunks.values()}.values():
        z = np.zeros(a.shape, a.dtype)
        ks.rule(z, z)
        with np.errstate(all="ignore"):
            o = np.asarray(ks.fn(z, z))
        if o.shape != a.shape or o.dtype != a.dtype:
            raise Invalid("fold type")
    with np.errstate(all="ignore"):
        return {g: functools.reduce(ks.fn, cs) for g, cs in groups.items()}


def m_rekey(m: MRel, fn):
    out = {}
    for k, a in m.chunks.items():
        try:
            new = fn(k)
        except Exception:
            raise Invalid("key fn raised") from None
        for nk in new if isinstance(new, list) else [new]:
            if _is_int(nk):
                nk = (nk,)
            if not isinstance(nk, tuple) or not all(_is_int(v) and 0 <= v < 2**63 for v in nk):
                raise Invalid("bad key")
            nk = tuple(int(v) for v in nk)
            if nk in out:
                raise Invalid("duplicate")
            out[nk] = a
    if len({len(k) for k in out}) > 1:
        raise Invalid("arities")
    return out


def m_filter(m: MRel, pred):
    out = {}
    for k, a in m.chunks.items():
        try:
            v = pred(k)
        except Exception:
            raise Invalid("pred raised") from None
        if not isinstance(v, (bool, np.bool_)):
            raise Invalid("pred not bool")
        if v:
            out[k] = a
    return out


def m_tile(m: MRel, d, size, rank):
    if not _is_int(d) or not 0 <= d < rank:
        raise Invalid("tile dim")
    if not _is_int(size) or size < 1:
        raise Invalid("tile size")
    out = {}
    for k, a in m.chunks.items():
        for t, s in enumerate(range(0, a.shape[d], size)):
            idx = [slice(None)] * a.ndim
            idx[d] = slice(s, s + size)
            out[k + (t,)] = a[tuple(idx)]
    return out


def m_concat(m: MRel, kd, ad, rank):
    if not _is_int(kd) or not 0 <= kd < _arity(m):
        raise Invalid("key dim")
    if not _is_int(ad) or not 0 <= ad < rank:
        raise Invalid("array dim")
    groups = defaultdict(dict)
    for k, a in m.chunks.items():
        groups[k[:kd] + k[kd + 1:]][k[kd]] = a
    out = {}
    for g, by in groups.items():
        if sorted(by) != list(range(len(by))):
            raise Invalid("gaps")
        cs = [by[i] for i in range(len(by))]
        if len({tuple(s for j, s in enumerate(c.shape) if j != ad) for c in cs}) > 1:
            raise Invalid("shapes")
        out[g] = np.concatenate(cs, axis=ad)
    return out


def continuous(chunks) -> bool:
    if not chunks:
        return False
    keys = list(chunks)
    arity = len(keys[0])
    frontier = [max(k[d] for k in keys) + 1 for d in range(arity)]
    return len(keys) == math.prod(frontier)


def same_chunks(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: keys {sorted(got)[:8]} != model {sorted(want)[:8]}"
    for key, w in want.items():
        g = np.asarray(got[key])
        assert g.shape == w.shape, f"{what}: chunk {key} has shape {g.shape}, model {w.shape}"
        assert g.dtype == w.dtype, f"{what}: chunk {key} has dtype {g.dtype}, model {w.dtype}"
        if w.dtype.kind in "fc":  # a plan may fold in another order: rounding differs
            tol = {2: 5e-2, 4: 1e-5}.get(np.finfo(w.dtype).bits // 8, 1e-9)
            assert np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True), f"{what}: chunk {key} differs"
        else:
            assert np.array_equal(g, w), f"{what}: chunk {key} differs"


# ---------------------------------------------------------------------------
# outcomes


def clear_error(e: BaseException, names, what: str) -> None:
    """``e`` must be a ValueError/TypeError whose message names one of ``names``."""
    assert isinstance(e, (ValueError, TypeError)), f"{what}: {type(e).__name__}: {e}"
    msg = str(e)
    assert any(n and n in msg for n in names), f"{what}: the message names none of {names}: {msg}"


def expect_fault(e: BaseException | None, kind: str, names, what: str, detail=None) -> None:
    """Running a program with a fault only running can show: the user's own exception
    (a kernel or loader that raises), or the documented error naming the kernel (a
    kernel that lies) or the loader (a chunk of the wrong shape/dtype)."""
    assert e is not None, f"{what}: a {kind} fault ran without an error"
    if kind == "raise":  # the user's own exception, as the model's run of the same code raised it
        orig = detail if isinstance(detail, BaseException) else FloatingPointError(BOOM)
        assert isinstance(e, type(orig)) and str(orig) in str(e), f"{what}: {type(e).__name__}: {e} (want {orig!r})"
    elif kind == "lie":
        assert isinstance(e, RuntimeError) and "came out with shape" in str(e), f"{what}: {type(e).__name__}: {e}"
        assert any(n in str(e) for n in names), f"{what}: names none of {names}: {e}"
    elif kind == "loader":
        assert isinstance(e, ValueError) and "returned a chunk of shape" in str(e), f"{what}: {type(e).__name__}: {e}"
        assert any(n in str(e) for n in names), f"{what}: names none of {names}: {e}"
    else:  # pragma: no cover
        raise AssertionError(kind)


# ---------------------------------------------------------------------------
# the random programs

DTYPES = ["float64", "float32", "int64", "int32", "bool"]


def _array(data, rank=None):
    rank = data.draw(st.integers(0, 3), label="rank") if rank is None else rank
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank), label="shape"))
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    vals = rng.integers(-3, 4, size=shape)
    if dtype.startswith("float"):
        vals = vals + 0.25
    return np.asarray(vals).astype(dtype)


def _chunks(data, shape, hostile):
    good = st.one_of(
        st.integers(1, 4),
        st.tuples(*[st.one_of(st.integers(1, n + 1), st.sampled_from([-1, None])) for n in shape]),
    )
    if not hostile:
        return data.draw(good, label="chunks")
    bad = st.sampled_from([0, -2, 1.5, float("nan"), float("inf"), "2", (1,) * (len(shape) + 1), True])
    return data.draw(st.one_of(good, bad), label="chunks")


_BAD_SIZES = [float("nan"), float("inf"), -float("inf"), -1, 0, 2.0, 4.7, "12", "3", None, True, (), [2, 2.5]]


class Loader:
    """A from_function loader cutting ``arr`` (``mode``: "ok", "raise", "shape", "dtype")."""

    def __init__(self, arr, chunks, mode="ok"):
        self.arr, self.chunks, self.mode = arr, chunks, mode
        self.__name__ = f"loader_{mode}"

    def __call__(self, key):
        if self.mode == "raise":
            raise FloatingPointError(BOOM)
        c = self.arr[tuple(slice(k * c, (k + 1) * c) for k, c in zip(key, self.chunks))]
        if self.mode == "shape":
            return np.concatenate([c.reshape(-1), c.reshape(-1)])
        if self.mode == "dtype":
            return c.astype(np.float32 if c.dtype != np.float32 else np.float64)
        return c


def draw_source(data, i: int, hostile: bool, stats: Counter):
    """A source relation and its model, or None (refused, checked)."""
    kind = data.draw(st.sampled_from(["numpy", "function", "chunks"]), label="source")
    arr = _array(data)
    name = f"S{i}"
    if hostile and kind == "numpy" and data.draw(st.integers(0, 9), label="not an array") == 0:
        junk = data.draw(st.sampled_from([np.zeros((0, 3)), np.zeros((2, 0)), [[1.0, 2.0], [3.0]], "abc", None,
                                          np.array([None, 1]), {"a": 1}]), label="junk")
        with pytest.raises((ValueError, TypeError)) as ei:
            td.from_numpy(junk, 1, name=name)
        clear_error(ei.value, [name], f"from_numpy({junk!r})")
        stats["clear_error"] += 1
        return None
    chunks = _chunks(data, arr.shape, hostile)
    fault = None
    try:
        if kind == "numpy":
            try:
                c = model_chunks(chunks, arr.shape)
                want = _cut(arr, c)
            except Invalid:
                want = None
            build = lambda: td.from_numpy(arr, chunks, name=name)  # noqa: E731
        elif kind == "function":
            shape = arr.shape
            if hostile and data.draw(st.booleans(), label="bad shape"):
                shape = data.draw(st.sampled_from(_BAD_SIZES), label="shape arg")
            dtype = arr.dtype
            if hostile and data.draw(st.integers(0, 9), label="bad dtype") == 0:
                dtype = data.draw(st.sampled_from(["U3", object, "not a dtype", 3.5]), label="dtype arg")
            mode = data.draw(st.sampled_from(["ok"] * 6 + ["raise", "shape", "dtype"]) if hostile else st.just("ok"),
                             label="loader")
            try:
                ms = model_shape(shape)
                c = model_chunks(chunks, ms)
                if not (isinstance(dtype, np.dtype) and _numeric(dtype)):
                    raise Invalid("dtype")
                want = _cut(arr, c) if ms == arr.shape else {}
            except Invalid:
                want, c = None, None
            fn = Loader(arr, c or (1,) * arr.ndim, mode)
            if want is not None and mode == "raise":
                fault = "raise"
            elif want is not None and (mode != "ok" or ms != arr.shape):  # a chunk of the wrong shape/dtype
                fault = "loader"
            build = lambda: td.from_function(fn, shape, chunks, dtype, name=name)  # noqa: E731
        else:
            try:
                c = model_chunks(chunks, arr.shape)
                want = _cut(arr, c)
            except Invalid:
                c = (1,) * arr.ndim
                want = _cut(arr, c)
            given = dict(want)
            if hostile and data.draw(st.integers(0, 3), label="spoil") == 0 and len(given) > 1:
                spoil = data.draw(st.sampled_from(["hole", "dtype", "rank", "key"]), label="spoil how")
                k0_ = sorted(given)[-1] if spoil != "hole" else sorted(given)[0]
                if spoil == "hole":
                    del given[k0_]
                elif spoil == "dtype":
                    given[k0_] = given[k0_].astype(np.complex128 if given[k0_].dtype != np.complex128 else np.int8)
                elif spoil == "rank":
                    given[k0_] = given[k0_].reshape((1,) + given[k0_].shape)
                else:
                    given[tuple(float(v) for v in k0_) or ("x",)] = given.pop(k0_)
                want = None
            build = lambda: td.from_chunks(given, name=name)  # noqa: E731
        rel = build()
    except Exception as e:
        assert want is None, f"source {name} ({kind}, chunks={chunks!r}) refused: {type(e).__name__}: {e}"
        clear_error(e, [name], f"source {name}")
        stats["clear_error"] += 1
        return None
    assert want is not None, f"source {name} ({kind}, chunks={chunks!r}) accepted, the model refuses it"
    if fault:
        return MRel(rel, None, faulty=fault)
    check_type(rel, want, name)
    return MRel(rel, want)


def check_type(rel, want, what):
    """The type (keys, chunk shapes) tra_dask derived equals the model's chunks."""
    t = rel.type
    got = t.chunk_shapes()
    assert sorted(got) == sorted(want), f"{what}: typed keys {sorted(got)[:6]} != model {sorted(want)[:6]}"
    for k, a in want.items():
        assert got[k] == a.shape, f"{what}: typed chunk {k} as {got[k]}, model {a.shape}"


def _key_fns(arity):
    """(description, what tra_dask gets, the model's function)."""
    out = [
        ("identity", project(*range(arity)), lambda k: k),
        ("reverse", project(*reversed(range(arity))), lambda k: k[::-1]),
        ("callable reverse", lambda k: k[::-1], lambda k: k[::-1]),
        ("insert_dim(0, 2)", insert_dim(0, 2), lambda k: [(v,) + k for v in range(2)]),
        ("drop last", project(*range(arity - 1)), lambda k: k[:-1]),
        ("callable dim 5", lambda k: (k[5],), lambda k: (k[5],)),
        ("callable div 0", lambda k: (k[0] // 0,) if k else (1 // 0,), lambda k: (k[0] // 0,) if k else (1 // 0,)),
        ("callable negative", lambda k: tuple(v - 1 for v in k), lambda k: tuple(v - 1 for v in k)),
        ("callable str", lambda k: ("a",) * len(k), lambda k: ("a",) * len(k)),
        ("callable float", lambda k: tuple(v + 0.5 for v in k), lambda k: tuple(v + 0.5 for v in k)),
    ]
    if arity >= 2:
        out += [
            ("2*k0+k1", (2 * k0 + k1,), lambda k: (2 * k[0] + k[1],)),
            ("k0+k1", (k0 + k1,), lambda k: (k[0] + k[1],)),
            ("huge", (k0 * 2**62 + k1,), lambda k: (k[0] * 2**62 + k[1],)),
        ]
    return out


def _preds(arity):
    out = [
        ("true", True, lambda k: True),
        ("callable none", lambda k: None, lambda k: None),
        ("callable raises", lambda k: k[9] > 0, lambda k: k[9] > 0),
        ("callable first", lambda k: k == min(k, k), lambda k: k == min(k, k)),
    ]
    if arity >= 1:
        out += [("k0 < 1", k0 < 1, lambda k: k[0] < 1), ("k0 == 0", k0 == 0, lambda k: k[0] == 0)]
    if arity >= 2:
        out += [("k0 == k1", k0 == k1, lambda k: k[0] == k[1])]
    return out


def _dims(data, n, label, size=None):
    """Key or array dims: mostly in range, sometimes not (or not ints)."""
    size = data.draw(st.integers(0, max(n, 1)), label=f"{label} len") if size is None else size
    elem = st.one_of(st.integers(0, max(n - 1, 0)), st.integers(0, max(n - 1, 0)),
                     st.sampled_from([n, -1, 7, 1.0, "0"]))
    return tuple(data.draw(st.lists(elem, min_size=size, max_size=size), label=label))


def draw_step(data, pool, i, stats):
    """One operator over relations of the pool: its result with the model's chunks, or
    None (refused: the model must refuse it too, and the message must name the input).
    A result with a fault only running shows (a kernel that raises or lies) is an
    output only (``faulty`` set)."""
    op = data.draw(st.sampled_from(["transform", "join", "aggregate", "rekey", "filter", "tile", "concat", "matmul"]),
                   label="op")
    m = data.draw(st.sampled_from(pool), label="input")
    t = m.rel.type
    arity, rank = t.arity, t.rank
    inputs = [m]
    ks = None
    if op == "matmul":  # the paper's A @ B with a partner chunked to fit: join, then aggregate
        a = _grid(m.chunks) if m.chunks and arity == 2 and rank == 2 else None
        if a is None:
            op = "transform"
        else:
            kc = m.chunks[(0, 0)].shape[1]
            b = _array(data, rank=2)[:1].repeat(a.shape[1], axis=0)[:, :data.draw(st.integers(1, 5), label="n")]
            b = b + np.arange(b.shape[0])[:, None].astype(b.dtype)
            nc = data.draw(st.integers(1, 3), label="n chunks")
            B = MRel(td.from_numpy(b, (kc, nc), name=f"B{i}"), _cut(b, (kc, nc)))
            inputs.append(B)
            ks = _BINARY[5]
            desc = f"matmul({m.rel.label}, B{i})"
            agg = data.draw(st.sampled_from(_BINARY[:5]), label="agg kernel")

            def model():
                j = MRel(None, m_join(m, B, (1,), (0,), ks))
                return m_aggregate(j, (0, 2), agg)
            want = _model(model)
            build = lambda: td.aggregate(td.join(m.rel, B.rel, (1,), (0,), "matmul"), (0, 2), agg.spec)  # noqa: E731
    if op == "transform":
        ks = data.draw(st.sampled_from(_UNARY), label="kernel")
        desc = f"transform({m.rel.label}, {ks})"
        want = _model(lambda: m_transform(m, ks))
        build = lambda: td.transform(m.rel, ks.spec)  # noqa: E731
    elif op == "matmul":
        pass
    elif op == "join":
        r = data.draw(st.sampled_from(pool), label="right")
        inputs.append(r)
        ks = data.draw(st.sampled_from(_BINARY), label="kernel")
        n = data.draw(st.integers(0, min(arity, r.rel.key_arity)), label="join dims")
        lo = _dims(data, arity, "left_on", n)
        ro = _dims(data, r.rel.key_arity, "right_on", n if data.draw(st.integers(0, 9), label="len") else n + 1)
        desc = f"join({m.rel.label}, {r.rel.label}, {lo}, {ro}, {ks})"
        want = _model(lambda: m_join(m, r, lo, ro, ks))
        build = lambda: td.join(m.rel, r.rel, lo, ro, ks.spec)  # noqa: E731
    elif op == "aggregate":
        ks = data.draw(st.sampled_from(_BINARY[:6]), label="kernel")
        gb = _dims(data, arity, "group_by")
        desc = f"aggregate({m.rel.label}, {gb}, {ks})"
        want = _model(lambda: m_aggregate(m, gb, ks))
        build = lambda: td.aggregate(m.rel, gb, ks.spec)  # noqa: E731
    elif op == "rekey":
        d, spec, fn = data.draw(st.sampled_from(_key_fns(arity)), label="key fn")
        desc = f"rekey({m.rel.label}, {d})"
        want = _model(lambda: m_rekey(m, fn))
        build = lambda: td.rekey(m.rel, spec)  # noqa: E731
    elif op == "filter":
        d, spec, fn = data.draw(st.sampled_from(_preds(arity)), label="pred")
        desc = f"filter({m.rel.label}, {d})"
        want = _model(lambda: m_filter(m, fn))
        build = lambda: td.filter(m.rel, spec)  # noqa: E731
    elif op == "tile":
        d = data.draw(st.one_of(st.integers(0, max(rank - 1, 0)), st.sampled_from([rank, -1, 1.0])), label="tile dim")
        size = data.draw(st.one_of(st.integers(1, 4), st.sampled_from([0, -1, 2.5, float("nan"), float("inf")])),
                         label="tile size")
        desc = f"tile({m.rel.label}, {d}, {size})"
        want = _model(lambda: m_tile(m, d, size, rank))
        build = lambda: td.tile(m.rel, d, size)  # noqa: E731
    else:
        kd = data.draw(st.one_of(st.integers(0, max(arity - 1, 0)), st.sampled_from([arity, -1])), label="key dim")
        ad = data.draw(st.one_of(st.integers(0, max(rank - 1, 0)), st.sampled_from([rank, -1])), label="array dim")
        desc = f"concat({m.rel.label}, {kd}, {ad})"
        want = _model(lambda: m_concat(m, kd, ad, rank))
        build = lambda: td.concat(m.rel, kd, ad)  # noqa: E731
    # an empty input keeps its chunk type in tra_dask (a kernel is checked against it);
    # the model has no chunks to read it from: either answer is right there
    lenient = any(not x.chunks for x in inputs)
    stats["steps"] += 1
    try:
        rel = build()
    except Exception as e:
        assert want is None or lenient, f"step {i}: {desc} refused: {type(e).__name__}: {e}"
        names = [x.rel.label for x in inputs]
        if op == "matmul":  # the aggregation names its input, the join
            j = f"join({m.rel.label}, B{i})"
            names.append(j if len(j) <= 60 else j[:57] + "...")
        clear_error(e, names, f"step {i}: {desc}")
        stats["clear_error"] += 1
        return None
    assert want is not None or lenient, f"step {i}: {desc} accepted, the model refuses it ({rel!r})"
    stats[f"built {op}"] += 1
    if isinstance(want, Fault):
        return MRel(rel, None, faulty=(want.kind, [ks.name, ks.name.split()[-1], rel.label], want.detail))
    if want is None:
        want = {}
    check_type(rel, want, f"step {i}: {desc}")
    return MRel(rel, want)


def _model(f):
    try:
        return f()
    except Invalid:
        return None
    except Fault as e:
        return e
    except FloatingPointError as e:
        return Fault("raise", e)


@pytest.mark.slow
@fuzz(160)
@given(st.data())
def test_relational_programs(data):
    """Random programs over the TRA operators: the model's answer or a clear refusal."""
    stats = Counter(examples=1)
    hostile = data.draw(st.booleans(), label="hostile")
    pool = []
    nsrc = data.draw(st.integers(1, 3), label="sources")
    for i in range(nsrc):
        m = draw_source(data, i, hostile, stats)
        if m is not None:
            if m.faulty:  # a faulty loader: the source is the program's output
                run_faulty(m, m.faulty, [m.rel.label], stats)
                _merge(stats)
                return
            pool.append(m)
    if not pool:
        _merge(stats)
        return
    outputs = []
    for i in range(data.draw(st.integers(1, 5), label="steps")):
        m = draw_step(data, pool, i, stats)
        if m is None:
            continue
        if m.faulty:
            kind, names, detail = m.faulty
            run_faulty(m, kind, names, stats, detail)
            break
        pool.append(m)
        outputs.append(m)
    for m in (outputs or pool)[-2:]:
        check_result(m, stats, simulate=data.draw(st.integers(0, 3), label="simulate") == 0)
    _merge(stats)


def _merge(stats):
    COUNTS.update({f"relational {k}": v for k, v in stats.items()})


def run_faulty(m: MRel, kind, names, stats, detail=None):
    try:
        td.evaluate(m.rel, check=False)
    except Exception as e:
        expect_fault(e, kind, names, f"running {m.rel.label}", detail)
        stats["runtime_fault"] += 1
        return
    if m.rel.ntuples == 0:
        stats["correct"] += 1  # nothing ran the faulty code
        return
    raise AssertionError(f"running {m.rel.label}: a {kind} fault ran without an error")


def check_result(m: MRel, stats, simulate=False):
    """Evaluate an output: the model's chunks, or (holes/duplicates) the integrity
    error, as evaluate and the cluster path (td.submit's check) both give it."""
    rel, want = m.rel, m.chunks
    if not continuous(want):
        with pytest.raises(ValueError) as ei:
            td.evaluate(rel)
        clear_error(ei.value, [rel.label], f"evaluate({rel.label})")
        with pytest.raises(ValueError):
            check_outputs(rel)  # what td.submit/td.compute run first
        stats["clear_error"] += 1
        got = td.evaluate(rel, check=False)
        same_chunks(got, want, f"evaluate({rel.label}, check=False)")
        stats["correct"] += 1
        return
    got = td.evaluate(rel)
    same_chunks(got, want, f"evaluate({rel.label})")
    stats["correct"] += 1
    grid = _grid(want)
    if grid is None:
        with pytest.raises(ValueError) as ei:
            td.to_numpy(rel)
        clear_error(ei.value, [rel.label], f"to_numpy({rel.label})")
        stats["clear_error"] += 1
    if grid is not None:
        arr = td.to_numpy(rel)
        assert arr.shape == grid.shape and arr.dtype == grid.dtype, f"to_numpy({rel.label})"
        assert np.allclose(arr, grid, equal_nan=True) if grid.dtype.kind in "fc" else np.array_equal(arr, grid)
        stats["correct"] += 1
    if simulate:
        sites = 1 + (rel.ntuples % 3)
        sim = td.simulate(td.optimize(rel, sites=sites))
        same_chunks(sim.result, want, f"simulate(optimize({rel.label}, sites={sites}))")
        stats["correct"] += 1


def _grid(chunks):
    """The model's one array from a chunk grid (key dim d indexes array dim d), or
    None when the chunks do not form one."""
    keys = list(chunks)
    arity, a0 = len(keys[0]), next(iter(chunks.values()))
    if arity > a0.ndim:
        return None
    frontier = [max(k[d] for k in keys) + 1 for d in range(arity)]
    ext = []
    for d in range(a0.ndim):
        if d < arity:
            e = []
            for v in range(frontier[d]):
                s = {chunks[k].shape[d] for k in keys if k[d] == v}
                if len(s) != 1:
                    return None
                e.append(s.pop())
            ext.append(e)
        else:
            s = {c.shape[d] for c in chunks.values()}
            if len(s) != 1:
                return None
            ext.append([s.pop()])
    off = [np.r_[0, np.cumsum(e)] for e in ext]
    out = np.empty([int(sum(e)) for e in ext], dtype=a0.dtype)
    for k, c in chunks.items():
        idx = tuple(slice(int(off[d][k[d]]), int(off[d][k[d] + 1])) if d < arity else slice(None)
                    for d in range(a0.ndim))
        out[idx] = c
    return out


# ---------------------------------------------------------------------------
# the numpy-style front-end: numpy itself is the model

FDTYPES = ["float64", "float32", "int64", "bool"]


def _np_array(data):
    rank = data.draw(st.integers(0, 3), label="rank")
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank), label="shape"))
    dtype = data.draw(st.sampled_from(FDTYPES), label="dtype")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    vals = rng.integers(-3, 4, size=shape)
    if dtype.startswith("float"):
        vals = vals + 0.5
    return np.asarray(vals).astype(dtype)


_NOT_ARRAYS = [[[1.0, 2.0], [3.0]], "abc", None, np.array([None, 1]), {"a": 1}, np.array(["x"])]
# (empty axes and complex dtypes are arrays since issue 41: tests/test_complex_and_keywords.py)


def _leaf(data, x):
    """``x`` as a td.Array: plain, with given chunks (sometimes wrong), or through a
    relation; now and then not an array at all (refused)."""
    if data.draw(st.integers(0, 19), label="not an array") == 0:
        td.asarray(data.draw(st.sampled_from(_NOT_ARRAYS), label="junk"))  # must raise ValueError/TypeError
    how = data.draw(st.sampled_from(["asarray", "chunks", "relation"]), label="leaf")
    if how == "asarray":
        return td.asarray(x)
    c = data.draw(st.one_of(st.integers(1, 3), st.sampled_from([0, -1, 2.5, "2", (1,) * (x.ndim + 1)])), label="chunks")
    if how == "chunks":
        return td.from_array(x, chunks=c)
    return td.from_array(td.from_numpy(x, c, name=f"R{x.ndim}"))


_LETTERS = "ijkl"


def _subscripts(data, ranks):
    terms = []
    for r in ranks:
        t = "".join(data.draw(st.lists(st.sampled_from(_LETTERS), min_size=r, max_size=r), label="term"))
        if data.draw(st.integers(0, 7), label="ellipsis") == 0 and r:
            k = data.draw(st.integers(0, r), label="ell at")
            t = t[:k] + "..." + t[k + 1:] if k < r else t + "..."
        if data.draw(st.integers(0, 19), label="wrong rank") == 0:
            t = t + "i"
        terms.append(t)
    lhs = ",".join(terms)
    mode = data.draw(st.sampled_from(["implicit", "explicit", "explicit", "bad"]), label="output")
    if mode == "implicit":
        return lhs
    letters = sorted(set("".join(terms).replace(".", "")))
    out = "".join(data.draw(st.permutations(letters), label="out")[:data.draw(st.integers(0, len(letters)), label="n")])
    if "..." in lhs:
        out = "..." + out
    if mode == "bad":
        out += data.draw(st.sampled_from(["z", "i", "!", "->"]), label="bad")
    return f"{lhs}->{out}"


def _front_op(data, pool):
    """``(description, numpy function, td function, operands)``."""
    op = data.draw(st.sampled_from(["einsum", "matmul", "tensordot", "dot", "binary", "scalar", "unary", "reduce",
                                    "arg", "transpose", "index", "ufunc"]), label="front op")
    a = data.draw(st.sampled_from(pool), label="a")
    if op == "einsum":
        n = data.draw(st.integers(1, 3), label="operands")
        ops = [a] + [data.draw(st.sampled_from(pool), label="b") for _ in range(n - 1)]
        sub = _subscripts(data, [o[0].ndim for o in ops])
        return f"einsum({sub!r})", lambda *xs: np.einsum(sub, *xs), lambda *xs: td.einsum(sub, *xs), ops
    if op in ("matmul", "tensordot", "dot", "binary"):
        b = data.draw(st.sampled_from(pool), label="b")
        if op == "matmul":
            return "matmul", np.matmul, td.matmul, [a, b]
        if op == "dot":
            return "dot", np.dot, td.dot, [a, b]
        if op == "tensordot":
            axes = data.draw(st.one_of(st.integers(-1, 3), st.tuples(st.lists(st.integers(-3, 3), max_size=2),
                                                                       st.lists(st.integers(-3, 3), max_size=2))),
                             label="axes")
            return f"tensordot(axes={axes})", lambda x, y: np.tensordot(x, y, axes), \
                lambda x, y: td.tensordot(x, y, axes), [a, b]
        name = data.draw(st.sampled_from(["+", "-", "*", "/", "<", ">=", "maximum", "minimum"]), label="binop")
        f = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y, "/": lambda x, y: x / y,
             "<": lambda x, y: x < y, ">=": lambda x, y: x >= y, "maximum": np.maximum, "minimum": np.minimum}[name]
        return name, f, f, [a, b]
    if op == "scalar":
        c = data.draw(st.sampled_from([2, -1, 0.5, 0, float("nan"), float("inf"), True]), label="scalar")
        name = data.draw(st.sampled_from(["+", "*", "/", "**", "r-"]), label="scalar op")
        f = {"+": lambda x: x + c, "*": lambda x: x * c, "/": lambda x: x / c, "**": lambda x: x ** c,
             "r-": lambda x: c - x}[name]
        # numpy's array ** 2 is np.square (bool ** 2 is int8), np.power(x, 2) is not: td follows np.power
        npf = (lambda x: np.power(x, c)) if name == "**" else f
        return f"x {name} {c}", npf, f, [a]
    if op in ("unary", "ufunc"):
        name = data.draw(st.sampled_from(["exp", "log", "sqrt", "tanh", "abs", "negative"]), label="unary")
        if op == "unary" and name in ("abs", "negative"):
            f = {"abs": abs, "negative": lambda x: -x}[name]
            return name, f, f, [a]
        return name, getattr(np, name), getattr(np, name), [a]
    if op == "reduce":
        name = data.draw(st.sampled_from(["sum", "max", "min", "mean"]), label="reduce")
        axis = data.draw(st.one_of(st.none(), st.integers(-3, 3), st.tuples(st.integers(-2, 2), st.integers(-2, 2)),
                                   st.sampled_from([1.0, "0"])), label="axis")
        keep = data.draw(st.booleans(), label="keepdims")
        return f"{name}(axis={axis!r}, keepdims={keep})", lambda x: getattr(x, name)(axis=axis, keepdims=keep), \
            lambda x: getattr(x, name)(axis=axis, keepdims=keep), [a]
    if op == "arg":
        name = data.draw(st.sampled_from(["argmin", "argmax"]), label="arg")
        axis = data.draw(st.one_of(st.none(), st.integers(-3, 3)), label="axis")
        return f"{name}(axis={axis})", lambda x: getattr(x, name)(axis=axis), lambda x: getattr(x, name)(axis=axis), [a]
    if op == "transpose":
        axes = data.draw(st.one_of(st.none(), st.lists(st.integers(-3, 3), max_size=3).map(tuple)), label="perm")
        return f"transpose({axes})", lambda x: np.transpose(x, axes), lambda x: x.transpose(axes), [a]
    idx = tuple(data.draw(st.lists(st.one_of(
        st.integers(-5, 5), st.builds(slice, st.integers(-4, 4) | st.none(), st.integers(-4, 5) | st.none()),
        st.just(Ellipsis)), max_size=3), label="index"))
    return f"x[{idx}]", lambda x: x[idx], lambda x: x[idx], [a]


def _close(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, numpy {want.dtype}"
    if want.dtype.kind in "fc":
        tol = 1e-3 if want.dtype.itemsize <= 4 else 1e-7
        assert np.allclose(got, want, rtol=tol, atol=tol, equal_nan=True), f"{what}: values differ\n{got}\n{want}"
    else:
        assert np.array_equal(got, want), f"{what}: values differ\n{got}\n{want}"


@pytest.mark.slow
@fuzz(120)
@given(st.data())
def test_array_expressions(data):
    """Random numpy-style expressions: numpy's answer, or a clear refusal when written."""
    stats = Counter(examples=1)
    pool = []
    for i in range(data.draw(st.integers(1, 3), label="arrays")):
        x = _np_array(data)
        try:
            pool.append((x, _leaf(data, x)))
        except (ValueError, TypeError) as e:
            clear_error(e, ["from_array", "from_numpy", f"R{x.ndim}"], "leaf")
            stats["clear_error"] += 1
    if not pool:
        COUNTS.update({f"array {k}": v for k, v in stats.items()})
        return
    made = []
    for _ in range(data.draw(st.integers(1, 4), label="ops")):
        desc, npf, tdf, ops = _front_op(data, pool)
        stats["steps"] += 1
        try:
            with np.errstate(all="ignore"):
                want = np.asarray(npf(*(o[0] for o in ops)))
        except Exception as e:
            want = e
        try:
            got = tdf(*(o[1] for o in ops))
        except Exception as e:
            allowed = (ValueError, TypeError, IndexError) if desc.startswith("x[") else (ValueError, TypeError)
            assert isinstance(e, allowed), f"{desc}: {type(e).__name__}: {e}"
            assert str(e), f"{desc}: an error with no message"
            stats["clear_error"] += 1
            continue
        assert isinstance(got, td.Array), f"{desc}: got a {type(got).__name__}, not a td.Array"
        assert not isinstance(want, Exception), f"{desc}: accepted (shape {got.shape}); numpy refuses it: {want}"
        assert got.shape == want.shape, f"{desc}: shape {got.shape}, numpy {want.shape}"
        pool.append((want, got))
        made.append((desc, want, got))
    for desc, want, got in made[-2:]:
        with np.errstate(all="ignore"):
            out = td.to_numpy(got)
        _close(np.asarray(out), want, desc)
        stats["correct"] += 1
    COUNTS.update({f"array {k}": v for k, v in stats.items()})


# ---------------------------------------------------------------------------
# declared kernels: td.kernel with random (often wrong) declarations

_JUNK_SHAPES = ["12", (4.7, 2.2), None, -1, (2, -1), "same", 3.0, (True,), [2, 2]]


def _shape_rule(data):
    """``(declaration, the model's rule: in shapes -> out shape or Invalid)``."""
    how = data.draw(st.sampled_from(["same", "broadcast", "sameish", 5, "dry run", "fn", "fn raises", "fn junk"]),
                    label="shape=")
    if how == "same":
        def rule(*ss):
            if len(set(ss)) != 1:
                raise Invalid("same")
            return ss[0]
        return "same", rule
    if how == "broadcast":
        def rule(*ss):
            try:
                return tuple(np.broadcast_shapes(*ss))
            except ValueError:
                raise Invalid("broadcast") from None
        return "broadcast", rule
    if how in ("sameish", 5):
        return how, None  # refused when declared
    if how == "dry run":
        return None, "dry run"
    if how == "fn":
        return (lambda *ss: ss[0]), (lambda *ss: ss[0])
    if how == "fn raises":
        return (lambda *ss: ss[7]), "raises"
    junk = data.draw(st.sampled_from(_JUNK_SHAPES), label="junk")
    if _is_int(junk) and junk >= 0 or isinstance(junk, (tuple, list)) and all(_is_int(v) and v >= 0 for v in junk):
        shape = (junk,) if _is_int(junk) else tuple(junk)  # not junk after all: a fixed shape
        return (lambda *ss: junk), (lambda *ss: shape)
    return (lambda *ss: junk), ("junk", junk)


def _kernel_fn(data, arity):
    how = data.draw(st.sampled_from(["honest", "halves", "raises", "float32"]), label="fn")
    if how == "raises":
        f = _boom
    elif how == "halves":  # a smaller chunk: lies unless the rule says so
        f = (lambda x: x[..., :1]) if arity == 1 else (lambda x, y: (x + y)[..., :1])
    elif how == "float32":
        f = (lambda x: np.asarray(x, np.float32)) if arity == 1 else (lambda x, y: np.asarray(x + y, np.float32))
    else:
        f = (lambda x: x * 2) if arity == 1 else (lambda x, y: x + y)
    return how, f


_NKERNELS = itertools.count()


@pytest.mark.slow
@fuzz(60)
@given(st.data())
def test_declared_kernels(data):
    """td.kernel with random declarations, used by transform and join: a refusal at
    declaration (naming the kernel) or at construction (naming the relation), the
    model's answer, or — for a declaration that lies — the error naming the kernel."""
    stats = Counter(examples=1)
    arity = data.draw(st.sampled_from([1, 2]), label="arity")
    decl, mrule = _shape_rule(data)
    how, f = _kernel_fn(data, arity)
    name = f"fuzz_decl_{next(_NKERNELS)}"
    bad_arity = data.draw(st.sampled_from([None] * 8 + [0, 3, 1.5]), label="arity=")
    flops = data.draw(st.sampled_from(["elementwise"] * 8 + ["nope", 7]), label="flops=")
    x = _array(data)
    x = x if x.ndim else x.reshape(1)
    c = data.draw(st.integers(1, 3), label="chunks")
    A = td.from_numpy(x, c, name="K")
    try:
        k = td.kernel(f, name=name, arity=bad_arity if bad_arity is not None else arity, shape=decl, flops=flops,
                      register_as=False)
    except Exception as e:
        assert mrule is None or bad_arity is not None or flops != "elementwise", \
            f"td.kernel({decl!r}) refused: {type(e).__name__}: {e}"
        clear_error(e, [name], f"td.kernel(shape={decl!r}, arity={bad_arity}, flops={flops!r})")
        stats["clear_error"] += 1
        COUNTS.update({f"kernel {k_}": v for k_, v in stats.items()})
        return
    assert mrule is not None and bad_arity is None and flops == "elementwise", f"td.kernel({decl!r}) accepted"
    model = MRel(A, _cut(x, (c,) * x.ndim))
    if mrule == "dry run":
        rule = KSpec(name, k, f, _probe(f), None, arity)
    elif mrule in ("raises",) or (isinstance(mrule, tuple) and mrule[0] == "junk"):
        def rule(*xs):
            raise Invalid("the declared rule raises or returns junk")
        rule = KSpec(name, k, f, rule, None, arity)
    else:
        def check(*xs, _r=mrule):
            _r(*(x.shape for x in xs))
        rule = KSpec(name, k, f, check, None, arity)
        rule.check_declared = lambda out, *xs, _r=mrule: _declared(out, _r, xs)
    want = _model(lambda: m_transform(model, rule) if arity == 1 else m_join(model, model, (0,), (0,), rule))
    try:
        rel = td.transform(A, k) if arity == 1 else td.join(A, A, (0,), (0,), k)
    except Exception as e:
        assert want is None, f"{name} ({decl!r}, {how}) refused: {type(e).__name__}: {e}"
        clear_error(e, ["K"], f"{name} ({decl!r}, {how})")
        stats["clear_error"] += 1
        COUNTS.update({f"kernel {k_}": v for k_, v in stats.items()})
        return
    assert want is not None, f"{name} ({decl!r}, {how}) accepted, the model refuses it"
    if isinstance(want, Fault):
        run_faulty(MRel(rel, None), want.kind, [name, rel.label], stats, want.detail)
    else:
        check_result(MRel(rel, want), stats)
    COUNTS.update({f"kernel {k_}": v for k_, v in stats.items()})


def _declared(out, rule, xs):
    shape = rule(*(x.shape for x in xs))
    if out.shape != tuple(shape) or out.dtype != np.result_type(*(x.dtype for x in xs)):
        raise Fault("lie")


# ---------------------------------------------------------------------------
# a share on a real cluster: td.submit / td.compute / x.compute()

CLUSTER_WAIT = 60  # seconds: a result or an error, never a hang


# `client`: the shared 2-worker cluster of tests/conftest.py


def _bounded(f):
    """``f()`` in a thread, failed (not hung) past :data:`CLUSTER_WAIT`."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(f).result(timeout=CLUSTER_WAIT)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"no result and no error within {CLUSTER_WAIT} s: a hang") from None
    finally:
        pool.shutdown(wait=False)


def on_cluster(client, m: MRel, stats, kind=None, names=(), detail=None):
    """Run ``m`` on the cluster: the model's chunks, the integrity error before
    anything is sent (holes, duplicates), or the fault's own error."""
    rel = m.rel
    if kind is None and not continuous(m.chunks):
        with pytest.raises(ValueError) as ei:
            td.submit(rel, client=client)
        clear_error(ei.value, [rel.label], f"td.submit({rel.label})")
        stats["clear_error"] += 1
        return
    t0 = time.monotonic()
    try:
        got = _bounded(lambda: td.compute(rel, client=client, progress=False))
    except AssertionError:
        raise
    except Exception as e:
        assert kind is not None, f"td.compute({rel.label}): {type(e).__name__}: {e}"
        if kind in ("raise", "lie"):  # a node's tasks run in any order there: either error
            ok = isinstance(e, RuntimeError) and "came out with shape" in str(e)
            if not ok:
                expect_fault(e, "raise", names, f"td.compute({rel.label})", detail)
        else:
            expect_fault(e, kind, names, f"td.compute({rel.label})", detail)
        stats["runtime_fault"] += 1
        return
    assert kind is None or rel.ntuples == 0, f"td.compute({rel.label}): a {kind} fault ran without an error"
    same_chunks(got, m.chunks or {}, f"td.compute({rel.label})")
    stats["correct"] += 1
    stats["cluster seconds"] += time.monotonic() - t0


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")  # the cluster's threads use random
@fuzz(10, share=0.05)
@given(st.data())
def test_relational_programs_on_a_cluster(client, data):
    """The relational programs, a few, on a 2-worker LocalCluster."""
    stats = Counter(examples=1)
    pool = []
    for i in range(data.draw(st.integers(1, 2), label="sources")):
        m = draw_source(data, i, False, stats)
        if m is not None:
            pool.append(m)
    last = pool[-1]
    for i in range(data.draw(st.integers(1, 3), label="steps")):
        m = draw_step(data, pool, i, stats)
        if m is not None and m.faulty:
            kind, names, detail = m.faulty
            on_cluster(client, m, stats, kind, names, detail)
            break
        if m is not None:
            pool.append(m)
            last = m
    else:
        on_cluster(client, last, stats)
    COUNTS.update({f"cluster {k}": v for k, v in stats.items()})


def test_cluster_faults(client):
    """Each fault once on the cluster: a result with holes is refused before it is
    sent; a kernel that raises or lies, a loader that fails or returns the wrong
    chunk — each surfaces as its error, none hangs."""
    stats = Counter()
    x = np.arange(16.0).reshape(4, 4)
    A = td.from_numpy(x, 2, name="A")
    holes = td.filter(A, k0 == k1)
    for expr in (holes, td.filter(A, k0 == 1)):
        with pytest.raises(ValueError, match=r"holes below the frontier"):
            td.submit(expr, client=client)
        with pytest.raises(ValueError, match=r"holes below the frontier"):
            td.compute(expr, client=client, progress=False)
        stats["clear_error"] += 2
    raises = td.transform(A, _user("fuzz_boom", _boom, shape="same"))
    lies = td.transform(A, _user("fuzz_liar_shape", _liar_shape, shape="same"))
    bad_loader = td.from_function(Loader(x, (2, 2), "shape"), (4, 4), 2, "float64", name="L")
    failing_loader = td.from_function(Loader(x, (2, 2), "raise"), (4, 4), 2, "float64", name="L2")
    for rel, err, match in ((raises, FloatingPointError, BOOM), (lies, RuntimeError, "fuzz_liar_shape"),
                            (bad_loader, ValueError, "from_function L: fn"), (failing_loader, FloatingPointError, BOOM)):
        with pytest.raises(err, match=match):
            _bounded(lambda: td.compute(rel, client=client, progress=False))
        stats["runtime_fault"] += 1
    got = _bounded(lambda: td.compute(td.rekey(td.filter(A, k0 == k1), k0), client=client, progress=False))
    assert sorted(got) == [(0,), (1,)]
    stats["correct"] += 1
    y = _bounded(lambda: td.einsum("ij,jk->ik", x, x.T).compute(client=client))
    _close(y, x @ x.T, "einsum on the cluster")
    stats["correct"] += 1
    COUNTS.update({f"cluster {k}": v for k, v in stats.items()})


# ---------------------------------------------------------------------------
# found by the campaign, outside this module's files


def _dtype_law_program():
    B = td.from_numpy(np.ones((2, 2), bool), (1, 2), name="B")
    return td.aggregate(td.transform(B, "row_sum"), (), "add")  # row_sum of bools is int: 2 + 2


def test_distributive_laws_hold_for_the_dtype_only():
    expr = _dtype_law_program()
    want = td.evaluate(expr)[()]
    assert want.tolist() == [[4]]
    for sites in (1, 2):
        np.testing.assert_array_equal(td.simulate(td.optimize(expr, sites=sites)).result[()], want)
