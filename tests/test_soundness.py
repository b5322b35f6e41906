"""Soundness of the optimizer: it never changes a result.

Over random small TRA programs (joins with broadcasting kernels, aggregations,
symbolic rekeys and filters, registered / user-declared / plain-callable kernels,
including plain callables that merely *share a name* with a registered kernel,
ragged chunks, 1 to 7 sites, several outputs sharing subexpressions), every plan
``td.optimize`` produces -- the chosen one and every one in ``plan.alternatives`` --
must simulate to ``td.evaluate``'s result, and must move exactly the floats its cost
predicts (the default "exact" cost model).

``TRA_SOUNDNESS_EXAMPLES`` sets the number of random programs (default 150: each run of
the suite draws new ones, about a quarter of a CPU-second each); run a
longer campaign with e.g. ``TRA_SOUNDNESS_EXAMPLES=2000 pytest tests/test_soundness.py
--hypothesis-seed=1``.
"""

import itertools
import math
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tra_dask as td
from tra_dask.keys import Dim, as_predicate, insert_dim, project

EXAMPLES = int(os.environ.get("TRA_SOUNDNESS_EXAMPLES", "150"))

# keep every program tiny so that optimize + simulating every alternative stays fast
MAX_TUPLES = 40          # tuples in any relation of a program
MAX_FLOATS = 3000        # floats in any relation of a program
MAX_OPS = 5              # operators applied to the sources
ATTEMPTS = 12            # tries per operator before giving up on that step


# ---------------------------------------------------------------------------
# kernels: registered ones, user-declared ones (not registered) and plain callables


MEANING = {}  # function -> what it computes, for readable failure reports


def _named(name, fn, meaning=None):
    """``fn`` under ``name``: what a user gets from ``def add(a, b): ...``."""
    fn.__name__ = fn.__qualname__ = name
    if meaning:
        MEANING[fn] = meaning
    return fn


# plain callables that share a registered kernel's name but compute something else
PLAIN_ADD_IS_MAX = _named("add", lambda a, b: np.maximum(a, b), "plain callable add = np.maximum")  # bug 2
PLAIN_ADD_IS_MUL = _named("add", lambda a, b: a * b, "plain callable add = a * b")
PLAIN_MUL_IS_SUB = _named("mul", lambda a, b: a - b, "plain callable mul = a - b")
PLAIN_MAX_IS_MIN = _named("max", lambda a, b: np.minimum(a, b), "plain callable max = np.minimum")
PLAIN_ROW_SUM_IS_CUMSUM = _named("row_sum", lambda x: np.cumsum(x, axis=-1), "plain callable row_sum = cumsum")
PLAIN_EXP_IS_TRIPLE = _named("exp", lambda x: 3.0 * x, "plain callable exp = 3 * x")
PLAIN_RELU_IS_ABS = _named("relu", lambda x: np.abs(x), "plain callable relu = abs")
PLAIN_DIAG_IS_TRIU = _named("diag", lambda x: np.triu(x), "plain callable diag = triu")
PLAIN_TRANSPOSE_IS_FLIP = _named("transpose", lambda x: x[..., ::-1].copy(), "plain callable transpose = flip columns")
# plain callables with their own names
PLAIN_AXPY = _named("axpy", lambda a, b: 2.0 * a + b)
PLAIN_SUM = _named("plain_sum", lambda a, b: a + b)
PLAIN_FLIP = _named("flip_rows", lambda x: x[::-1].copy())
PLAIN_SQUARE = _named("square", lambda x: x * x)
PLAIN_SAME = _named("same", lambda x: x, "plain callable returning its input array")  # as the registered identity


def _max_fn(a, b):
    return np.maximum(a, b)


def _add_fn(a, b):
    return a + b


def _double(x):
    return 2.0 * x


def _col_sum(x):
    return x.sum(axis=0, keepdims=True)


def _col_sum_shape(s):
    if len(s) != 2:
        raise td.kernels.KernelTypeError(f"needs 2-d chunks, got {s}")
    return (1, s[1])


# user-declared kernels, none registered; their declared facts are true
MEANING[_max_fn] = "np.maximum"
USER_ADD_IS_MAX = td.kernel(_max_fn, name="add", shape="broadcast", associative=True, commutative=True,
                            register_as=False)   # a declared kernel named "add" that is a max
USER_MAX = td.kernel(_max_fn, name="user_max", shape="broadcast", associative=True, commutative=True,
                     register_as=False)
USER_ADD = td.kernel(_add_fn, name="user_add", shape="broadcast", associative=True, commutative=True,
                     identity=0.0, register_as=False)
USER_DOUBLE = td.kernel(_double, name="double", shape="same", distributes_over=("add", "sub", "max", "min"),
                        register_as=False)
USER_COL_SUM = td.kernel(_col_sum, name="col_sum", shape=_col_sum_shape, distributes_over=("add", "sub"),
                         register_as=False)   # true for equal shapes only, like row_sum
USER_ROW_SUM_IS_DOUBLE = td.kernel(_double, name="row_sum", shape="same", register_as=False)
USER_PROBED = td.kernel(lambda x: x[:, :1] * 1.0, name="first_col", register_as=False)  # shape learned by probing

# registered kernels about half the time; plain callables and user kernels that share a
# registered kernel's name often, since rules that go by names are what they catch
JOIN_KERNELS = ["add", "sub", "mul", "max", "min", "add", "mul", "matmul",
                PLAIN_ADD_IS_MAX, PLAIN_ADD_IS_MUL, PLAIN_MUL_IS_SUB, PLAIN_MAX_IS_MIN, USER_ADD_IS_MAX,
                PLAIN_AXPY, PLAIN_SUM, USER_MAX, USER_ADD]
AGG_KERNELS = ["add", "max", "min", "add",
               PLAIN_ADD_IS_MAX, PLAIN_ADD_IS_MUL, PLAIN_MAX_IS_MIN, USER_ADD_IS_MAX,
               PLAIN_SUM, USER_MAX, USER_ADD]
UNARY_KERNELS = ["row_sum", "diag", "transpose", "relu", "exp", "neg", "row_max", "identity",
                 "row_sum", "diag", "transpose", "row_max", "neg",
                 td.kernels.scale(0.5), td.kernels.scale(-2.0),
                 PLAIN_ROW_SUM_IS_CUMSUM, PLAIN_EXP_IS_TRIPLE, PLAIN_RELU_IS_ABS, PLAIN_DIAG_IS_TRIU,
                 PLAIN_TRANSPOSE_IS_FLIP, PLAIN_FLIP, PLAIN_SQUARE, PLAIN_SAME,
                 USER_DOUBLE, USER_COL_SUM, USER_ROW_SUM_IS_DOUBLE, USER_PROBED]


# kernels that share a registered kernel's name (and an aggregation may use: AGGREGATABLE)
NAMESAKES = {"add": [PLAIN_ADD_IS_MAX, PLAIN_ADD_IS_MUL, USER_ADD_IS_MAX], "mul": [PLAIN_MUL_IS_SUB],
             "max": [PLAIN_MAX_IS_MIN]}
AGGREGATABLE = ("add", "max", "min", "mul")

# after a join or an aggregation: mostly kernels with distributive laws (and the
# shape-changing, position-dependent ones whose laws hold for equal shapes only)
MAP_KERNELS = ["row_sum", "row_sum", "diag", "transpose", "neg", "neg", "relu", "exp", "row_max",
               td.kernels.scale(-2.0), USER_COL_SUM, USER_DOUBLE, PLAIN_ROW_SUM_IS_CUMSUM, PLAIN_EXP_IS_TRIPLE,
               USER_ROW_SUM_IS_DOUBLE]

# after a join of chunks of different shapes: mostly the kernels whose laws hold for
# equal shapes only
BJOIN_MAP_KERNELS = ["row_sum", "row_sum", "diag", "diag", "transpose", "row_max", USER_COL_SUM, "neg",
                     td.kernels.scale(-2.0)]

# ---------------------------------------------------------------------------
# random programs

OPS = ["join", "join", "bjoin", "aggregate", "aggregate", "transform", "transform", "join+map", "join+map",
       "bjoin+map", "bjoin+map", "aggregate+map", "aggregate+map", "aggregate+map", "rekey", "rekey", "filter",
       "filter", "tile"]


def _small(r):
    t = r.type
    sizes = np.array([math.prod(s) for s in t.shapes] or [0])
    return t.ntuples <= MAX_TUPLES and int(sizes[t.shape_ids].sum()) <= MAX_FLOATS


@st.composite
def sources(draw, n_sources):
    """1-3 source tensors over 1-3 shared axes (extent, chunk), so that joins line up:
    matrices, columns (n, 1), rows (1, n) and vectors.  Ragged chunking (extent not a
    multiple of the chunk) is common; chunk grids are at most 3x3."""
    axes = []
    for a in range(draw(st.integers(1, 3), label="axes")):
        grid = draw(st.integers(1, 3), label=f"axis {a} chunks")
        chunk = draw(st.integers(1, 4), label=f"axis {a} chunk size")
        n = grid * chunk
        if grid > 1 and chunk > 1 and draw(st.booleans(), label=f"axis {a} ragged"):
            n -= draw(st.integers(1, chunk - 1))   # the last chunk is smaller
        axes.append((n, chunk))
    unit = (1, 1)
    out = []
    for i in range(n_sources):
        kind = draw(st.sampled_from(["matrix", "matrix", "col", "row", "vector"]), label=f"S{i} kind")
        ax = st.sampled_from(axes)
        dims = {"matrix": [ax, ax], "col": [ax, st.just(unit)], "row": [st.just(unit), ax], "vector": [ax]}[kind]
        shape, chunks = zip(*(draw(d) for d in dims))
        seed = draw(st.integers(0, 2**16))
        x = np.random.default_rng(seed).normal(size=shape)
        out.append(td.from_numpy(x, chunks, name=f"S{i}"))
    return out


def _dims_perm(draw, arity, k, label):
    return tuple(draw(st.permutations(range(arity)), label=label)[:k]) if arity else ()


def _pred_atom(draw, arity):
    i = draw(st.integers(0, arity - 1))
    j = draw(st.integers(0, arity - 1))
    c = draw(st.integers(0, 2))
    kind = draw(st.sampled_from(["eq", "lt", "ge", "ne", "parity", "opaque"]))
    if kind == "eq":
        return Dim(i) == Dim(j)
    if kind == "lt":
        return Dim(i) < c + 1
    if kind == "ge":
        return Dim(i) >= c
    if kind == "ne":
        return Dim(i) != c
    if kind == "parity":
        return (Dim(i) + Dim(j)) % 2 == 0
    return as_predicate(_named("key_even", lambda key, i=i: key[i] % 2 == 0))   # opaque


def _key_fn(draw, r):
    a, fr = r.key_arity, r.frontier
    kind = draw(st.sampled_from(["perm", "perm", "project", "insert", "shift", "flatten", "opaque"]))
    if kind == "insert" or a == 0:
        return insert_dim(draw(st.integers(0, a)), draw(st.integers(1, 2)))
    if kind == "perm":
        return project(*draw(st.permutations(range(a))))
    if kind == "project":
        return project(*_dims_perm(draw, a, draw(st.integers(0, a)), "project dims"))
    if kind == "shift":
        i = draw(st.integers(0, a - 1))
        return tuple(Dim(d) + 1 if d == i else Dim(d) for d in range(a))
    if kind == "flatten" and a >= 2:
        i, j = draw(st.permutations(range(a)))[:2]
        rest = [Dim(d) for d in range(a) if d not in (i, j)]
        return (Dim(i) * int(fr[j]) + Dim(j), *rest)
    return _named("reverse_key", lambda key: tuple(reversed(key)))  # opaque key function


def _join_dims(draw, r, s, n):
    """Up to ``n`` pairs of key dims of ``r`` and ``s`` that range over the same key
    values (a join's requirement), drawn at random."""
    def values(rel, d):
        return tuple(np.unique(rel.type.keys[:, d]).tolist())

    lo, ro = [], []
    for _ in range(n):
        pairs = [(a, b) for a in range(r.key_arity) for b in range(s.key_arity)
                 if a not in lo and b not in ro and values(r, a) == values(s, b)]
        if not pairs:
            break
        a, b = draw(st.sampled_from(pairs), label="joined dims")
        lo.append(a)
        ro.append(b)
    return tuple(lo), tuple(ro)


def _uniform_groups(r, group_by):
    """Whether grouping ``r`` by ``group_by`` puts only chunks of one shape together."""
    t, seen = r.type, {}
    for key, sid in zip(map(tuple, t.keys[:, list(group_by)].tolist()), t.shape_ids.tolist()):
        if seen.setdefault(key, sid) != sid:
            return False
    return True


def _laws(k):
    """The binary kernel names a unary kernel spec declares it distributes over."""
    if isinstance(k, str):
        k = td.kernels.get_kernel(k)
    return sorted(k.distributes_over) if isinstance(k, td.Kernel) else []


def _one_op(draw, pool, op=None, kernel=None):
    """A new relation built from the pool by one random operator (may be invalid:
    the caller catches ValueError/TypeError and tries again)."""
    op = op or draw(st.sampled_from(OPS), label="op")
    if op.endswith("+map"):
        # a unary kernel right after a join or an aggregation: what R1-4 and R1-7 rewrite.
        # Mostly the binary kernel is one the unary kernel declares a law for -- by that
        # name: the registered kernel, or a namesake that computes something else
        m = draw(st.sampled_from(BJOIN_MAP_KERNELS if op == "bjoin+map" else MAP_KERNELS), label="map kernel")
        laws = [n for n in _laws(m) if op != "aggregate+map" or n in AGGREGATABLE]
        if laws and draw(st.integers(0, 3)) > 0:
            name = draw(st.sampled_from(laws), label="law")
            namesakes = [k for k in NAMESAKES.get(name, ()) if op != "aggregate+map" or k in AGG_KERNELS]
            kernel = draw(st.sampled_from([name, *namesakes]), label="kernel")
        return td.transform(_one_op(draw, pool, op[:-4], kernel), m)
    # half the time the newest relation: deeper chains (transform of a join, ...)
    r = pool[-1] if draw(st.booleans()) else draw(st.sampled_from(pool), label="input")
    if op in ("join", "bjoin"):
        # the right input: mostly another relation (a self-join pairs equal chunks, which
        # hides kernels that differ only on different arguments); for bjoin, mostly one
        # whose chunks have other shapes
        others = [p for p in pool if p is not r]
        if op == "bjoin":
            others = [p for p in others if set(p.type.shapes) != set(r.type.shapes)] or others
        s = draw(st.sampled_from(others if others and draw(st.integers(0, 3)) else pool), label="right input")
    if op == "bjoin":
        # joined on one key dim each: chunks of different shapes meet, e.g. (n, 1) and
        # (1, m), and the kernel broadcasts them
        lo, ro = _join_dims(draw, r, s, 1)
        kern = kernel or draw(st.sampled_from(JOIN_KERNELS), label="kernel")
        return td.join(r, s, lo, ro, kern)
    if op == "join":
        n = draw(st.integers(0, min(r.key_arity, s.key_arity, 2)))
        if n == r.key_arity == s.key_arity and draw(st.booleans()):
            lo = ro = tuple(range(n))   # elementwise join
        else:
            lo, ro = _join_dims(draw, r, s, n)
        kern = kernel or draw(st.sampled_from(JOIN_KERNELS), label="kernel")
        return td.join(r, s, lo, ro, kern)
    if op == "aggregate":
        # group by dims whose groups hold chunks of one shape (valid by construction),
        # mostly such that some group holds several chunks
        a, keys = r.key_arity, r.type.keys
        valid = [c for n in range(a + 1) for c in itertools.combinations(range(a), n) if _uniform_groups(r, c)]
        several = [c for c in valid if len({tuple(k) for k in keys[:, list(c)].tolist()}) < len(keys)]
        gb = draw(st.sampled_from(several if several and draw(st.integers(0, 3)) else valid), label="group_by")
        gb = tuple(draw(st.permutations(gb)))
        return td.aggregate(r, gb, kernel or draw(st.sampled_from(AGG_KERNELS), label="kernel"))
    if op == "transform":
        return td.transform(r, draw(st.sampled_from(UNARY_KERNELS), label="kernel"))
    if op == "rekey":
        return td.rekey(r, _key_fn(draw, r))
    if op == "filter":
        if r.key_arity == 0:
            raise ValueError("nothing to filter on")
        p = _pred_atom(draw, r.key_arity)
        comb = draw(st.sampled_from(["one", "one", "and", "or", "not"]))
        if comb == "and":
            p = p & _pred_atom(draw, r.key_arity)
        elif comb == "or":
            p = p | _pred_atom(draw, r.key_arity)
        elif comb == "not":
            p = ~p
        return td.filter(r, p)
    # tile, sometimes concatenated back
    d = draw(st.integers(0, r.rank - 1))
    t = td.tile(r, d, draw(st.integers(1, 3)))
    return td.concat(t, t.key_arity - 1, d) if draw(st.booleans()) else t


# generator bookkeeping: programs drawn, those left without an operator, operators tried,
# those that raised (invalid TRA, drawn again), those too big or empty
STATS = {"programs": 0, "rejected": 0, "attempts": 0, "invalid": 0, "too big or empty": 0}


@st.composite
def programs(draw):
    """(outputs, sites): a tuple of 1-3 relations over a shared DAG of operators."""
    pool = draw(sources(draw(st.integers(1, 3), label="sources")))
    n_ops = draw(st.integers(1, MAX_OPS), label="operators")
    built = []
    for _ in range(n_ops):
        for _attempt in range(ATTEMPTS):
            STATS["attempts"] += 1
            try:
                rel = _one_op(draw, pool)
            except (ValueError, TypeError):
                STATS["invalid"] += 1
                continue
            if rel.ntuples and _small(rel):
                pool.append(rel)
                built.append(rel)
                break
            STATS["too big or empty"] += 1
    STATS["programs"] += 1
    if not built:
        STATS["rejected"] += 1
    assume(built)
    n_out = draw(st.integers(1, 3), label="outputs")
    outs = [built[-1]] + [draw(st.sampled_from(pool)) for _ in range(n_out - 1)]
    sites = draw(st.integers(1, 7), label="sites")
    # some sources fixed where they are: replicated, partitioned on some key dims, or
    # scattered key by key; the others are free for the optimizer to place
    placements = {}
    for src in _sources_of(outs):
        kind = draw(st.sampled_from(["free", "free", "all", "dims", "scatter"]), label=f"{src.label} placement")
        if kind == "all":
            placements[src.label] = "all"
        elif kind == "dims":
            placements[src.label] = _dims_perm(draw, src.key_arity, draw(st.integers(0, src.key_arity)), "dims")
        elif kind == "scatter":
            placements[src.label] = {key: draw(st.integers(0, sites - 1)) for key in src.keys}
    return Program(tuple(outs), sites, placements or None)


class Program:
    """A random program: its outputs, the number of sites and fixed placements (a
    readable repr, for hypothesis' falsifying-example report)."""

    def __init__(self, outputs, sites, placements):
        self.outputs, self.sites, self.placements = outputs, sites, placements

    def __iter__(self):
        return iter((self.outputs, self.sites, self.placements))

    def __repr__(self):
        srcs = ", ".join(f"{s.label}: shape {s.array.shape} chunks {s.chunks}" for s in _sources_of(self.outputs))
        outs = "".join(f"\n  output {j}: {o!r}" for j, o in enumerate(self.outputs))
        kernels = {n.kernel for n in _nodes_of(self.outputs) if isinstance(getattr(n, "kernel", None), td.Kernel)}
        legend = sorted({f"\n  {k!r} ({'declared' if not k.opaque else 'plain'}): {MEANING[k.fn]}"
                         for k in kernels if k.fn in MEANING})
        return f"Program(sites={self.sites}, placements={self.placements}, sources [{srcs}]{outs}{''.join(legend)})"


def _nodes_of(outs):
    seen, stack, found = set(), list(outs), []
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        found.append(n)
        stack.extend(n.children)
    return found


def _sources_of(outs):
    found = {n.label: n for n in _nodes_of(outs) if not n.children}
    return [found[name] for name in sorted(found)]


# ---------------------------------------------------------------------------
# the check


def _describe(plan):
    return "\n".join(repr(o) for o in plan.outputs)


def same_tuples(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: keys {sorted(got)} != {sorted(want)}"
    for key in want:
        g, w = np.asarray(got[key]), np.asarray(want[key])
        assert g.shape == w.shape, f"{what}: chunk {key} has shape {g.shape}, want {w.shape}"
        assert np.allclose(g, w, equal_nan=True), f"{what}: chunk {key} differs:\n{g}\nwant\n{w}"


def check_every_plan(expr, sites, placements=None, want=None, **kw):
    """Every plan td.optimize considers simulates to td.evaluate's result and moves
    exactly the floats its cost predicts.  ``kw`` goes to td.optimize."""
    if want is None:
        want = td.evaluate(expr, check=False)
    plan = td.optimize(expr, sites=sites, placements=placements, **kw)
    outs = expr if isinstance(expr, tuple) else (expr,)
    wants = want if isinstance(expr, tuple) else (want,)
    for i, p in enumerate([plan, *plan.alternatives]):
        sim = td.simulate(p)
        got = sim.result if isinstance(expr, tuple) else (sim.result,)
        assert len(got) == len(outs)
        what = "chosen plan" if i == 0 else f"alternative {i}"
        for j, (g, w) in enumerate(zip(got, wants)):
            same_tuples(g, w, f"{what}, output {j}, {sites} sites:\n{_describe(p)}\n")
        assert p.cost.floats_moved == sim.floats_moved, (
            f"{what}, {sites} sites: predicted {p.cost.floats_moved} floats moved, simulated "
            f"{sim.floats_moved}:\n{_describe(p)}")
    return plan


# the time objective's cluster: the defaults, or one whose links or kernels are slow
# (other plans win, and other paths of the search run: a shared node's readers planned
# again over one placement, search.py's reshare)
CLUSTERS = [None, {"bandwidth": 1e7, "rates": {"blas": 1e10, "elementwise": 1e9}},
            {"bandwidth": 1e11, "rates": {"blas": 1e7, "elementwise": 1e6}},
            {"bandwidth": 1e9, "rates": {"blas": 1e9, "elementwise": 1e8}, "task_overhead": 1e-2},
            {"bandwidth": 1e9, "rates": {"blas": 1e9, "elementwise": 1e8}, "cores": 1}]  # every site on 1 core


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(programs(), st.sampled_from(CLUSTERS))
def test_every_optimized_plan_simulates_to_the_reference(prog, cluster):
    RUN["examples"] += 1
    outs, sites, placements = prog
    kw = {} if cluster is None else {"objective": "time", "cluster": td.ClusterSpec(sites, **cluster)}
    try:
        check_every_plan(outs, sites, placements, **kw)
    except AssertionError as e:
        if "first failure" not in RUN:
            RUN["first failure"] = RUN["examples"]
            print(f"test_soundness: first failure at example #{RUN['examples']}", file=sys.stderr, flush=True)
        raise AssertionError(f"{e}\n(the first failing example was #{RUN['first failure']} of this run)") from None


RUN = {"examples": 0}  # examples run by the property test (shrinking included), first failure


# ---------------------------------------------------------------------------
# regressions: the two bugs this property found first


def add(a, b):
    """A user's module-level function that happens to be called ``add`` (its
    ``__qualname__`` is "add") but computes a maximum: not the registered ``add``."""
    return np.maximum(a, b)


def _bug1_expr():
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=(8, 1)), rng.normal(size=(1, 8))
    j = td.join(td.from_numpy(u, (4, 1)), td.from_numpy(v, (1, 4)), (1,), (0,), "add")
    return td.transform(j, "row_sum")


@pytest.mark.parametrize("sites", [1, 2, 4])
def test_row_sum_is_not_pushed_into_a_broadcasting_join(sites):
    # R1-7's premap form: row_sum(a + b) != row_sum(a) + row_sum(b) when a is (4, 1)
    # and b is (1, 4) -- the law holds for equal shapes only
    e = _bug1_expr()
    check_every_plan(e, sites)


@pytest.mark.parametrize("sites", [1, 2, 3, 5])
def test_a_plain_callable_named_add_is_not_the_registered_add(sites):
    # a callable named "add" computing a maximum: R1-4 must not move row_sum through it
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
    A, B = td.from_numpy(a, (2, 2), name="A"), td.from_numpy(b, (2, 2), name="B")
    e = td.transform(td.aggregate(A, (0,), add), "row_sum")
    want = td.evaluate(e)
    np.testing.assert_allclose(td.to_numpy(e), np.maximum.reduce([a[:, 0:2], a[:, 2:4], a[:, 4:6]]).sum(1, keepdims=True))
    check_every_plan(e, sites, want=want)
    # nor neg, nor push either into a join through R1-7's premap form; and all of it as
    # several outputs sharing the aggregate
    n = td.transform(td.aggregate(A, (0,), add), "neg")
    j = td.transform(td.join(A, B, (0, 1), (0, 1), add), "row_sum")
    k = td.transform(td.join(A, B, (0,), (0,), add), "neg")
    for expr in (n, j, k, (e, n, j, td.aggregate(A, (0,), add))):
        check_every_plan(expr, sites)


@pytest.mark.parametrize("sites", [2, 3])
def test_a_kernel_on_copies_of_one_array_runs_once(sites):
    # insert_dim copies each array; a kernel map after it runs once per array per site
    # (work and layout alike), so a broadcast of the results moves each result once --
    # the cost said 8 floats where the simulator (and the lowering) moved 4
    s0 = td.from_numpy(np.random.default_rng(0).standard_normal((2, 2)), (1, 1), name="S0")
    e = td.join(s0, td.transform(td.rekey(s0, insert_dim(0, 2)), "row_sum"), (), (), "add")
    check_every_plan(e, sites)


def test_a_node_rebuilt_over_equal_children_moves_what_they_hold():
    # the search shares what equal nodes derived (physical.nodes.interned); a Shuffle
    # rebuilt over an equal LocalMap made apart took a layout naming the other map's
    # arrays, so its move of chunks a Broadcast already sent counted again: predicted
    # 15 floats moved, simulated (and on a cluster) 10
    s0 = td.from_numpy(np.random.default_rng(0).standard_normal((5, 5)), (3, 3), name="S0")
    t = td.transform(s0, "row_sum")
    u = td.transform(td.join(t, t, (0,), (0,), "add"), "row_sum")
    out0 = td.join(td.rekey(u, project(0, 1, 2)), s0, (0,), (0,), "add")
    check_every_plan((out0, u), 2, placements={"S0": (1,)})


@pytest.mark.slow
@pytest.mark.parametrize("dims,sites,where,bandwidth,blas,faster", [
    ((12, 24, 24, 40), 3, {"X": "20112122", "Y": "1112", "W1": "01212101", "W2": "1002"}, 1e8, 1e8, True),
    # (since R2-6 combines only the join dims that vary, the first pass finds this one's best plan too)
    ((8, 40, 8, 8), 3, {"X": "20101200", "Y": "0101", "W1": "22000021", "W2": "0212"}, 1e9, 1e10, False),
    ((12, 8, 8, 12), 3, {"X": "11002222", "Y": "0020", "W1": "02222002", "W2": "1222"}, 1e8, 1e10, True),
])
def test_plans_whose_readers_share_one_computation_are_sound(dims, sites, where, bandwidth, blas, faster):
    """Small FFNN steps on which the search's first pass computes a shared node twice
    and planning its readers over one of them (search.py, ``reshare``) finds a faster
    plan (``faster``; never a slower one): that plan and every alternative simulate to
    the reference, moving what their costs say."""
    from tra_dask.optimizer.objective import as_objective
    from tra_dask.programs import ffnn_sgd_step

    N, D, H, L = dims
    grids = {"X": (4, 2), "Y": (4, 1), "W1": (2, 4), "W2": (4, 1)}
    shapes = {"X": (N, D), "Y": (N, L), "W1": (D, H), "W2": (H, L)}
    rng = np.random.default_rng(sum(dims))
    rel = {n: td.from_numpy(rng.random(shapes[n]), tuple(-(-a // b) for a, b in zip(shapes[n], grids[n])), name=n)
           for n in shapes}
    placements = {n: {k: int(c) for k, c in zip(np.ndindex(*grids[n]), where[n])} for n in shapes}
    step = ffnn_sgd_step(rel["X"], rel["Y"], rel["W1"], rel["W2"], 0.1)
    spec = td.ClusterSpec(sites, bandwidth=bandwidth, rates={"blas": blas, "elementwise": 1e8})
    timed = as_objective("time", None, spec)
    both = check_every_plan(step, sites, placements, objective="time", cluster=spec).search
    first_pass = both.first_pass_cost  # (what search(..., reshare=0) finds: test_search checks it is)
    if faster:
        assert timed(both.best_cost) < timed(first_pass)  # the second pass found a faster plan
    assert timed(both.best_cost) <= timed(first_pass)


def test_the_generator_makes_mostly_valid_programs():
    """Most operators the generator tries are valid TRA (the others raise and are
    drawn again), and few programs end up without an operator."""
    before = dict(STATS)

    # derandomized: the share of invalid draws varies from run to run (a fresh-clone
    # run once saw 40% where most see under 20%); a fixed seed keeps the check exact
    @settings(max_examples=40, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=True)
    @given(programs())
    def generate(prog):
        pass

    generate()
    attempts, invalid = STATS["attempts"] - before["attempts"], STATS["invalid"] - before["invalid"]
    assert attempts > 40 and invalid <= 0.3 * attempts, STATS
    drawn = STATS["programs"] - before["programs"]
    # a draw whose every operator was invalid is rejected (assume) and drawn again: rare
    # (measured: 4 of 392 in one run), never most
    assert STATS["rejected"] - before["rejected"] <= 0.1 * drawn, STATS


@pytest.mark.parametrize("blocks,sites", [((2, 2, 2), 12), ((4, 1, 4), 20), ((3, 2, 1), 7), ((2, 3, 2), 64)])
def test_grids_on_fewer_sites_than_the_cluster_simulate_to_the_reference(blocks, sites):
    """Where no grid of every site fits a multiply's key grid, the 3-D multiply runs on
    a grid of the most sites that does (the rest idle): each of those plans, and every
    other the search considers, simulates to the reference and moves the floats its
    cost says."""
    bi, bk, bj = blocks
    rng = np.random.default_rng(sum(blocks) + sites)
    a = td.from_numpy(rng.standard_normal((6 * bi, 5 * bk)), (6, 5), name="A")
    b = td.from_numpy(rng.standard_normal((5 * bk, 4 * bj)), (5, 4), name="B")
    plan = check_every_plan(td.programs.matmul(a, b), sites, objective="time",
                            cluster=td.ClusterSpec(sites, bandwidth=1e11))
    from tra_dask.node import toposort
    from tra_dask.physical import Shuffle

    def grid_sites(p):
        return {int(np.prod(n.grid)) for n in toposort(p.outputs) if isinstance(n, Shuffle) and n.grid}

    smaller = [p for p in [plan, *plan.alternatives] if any(g < sites for g in grid_sites(p))]
    assert smaller, "no plan on a grid of fewer sites was considered"
    for p in smaller:  # its joins run on the grid's sites only
        used = {s for n, per_site in td.simulate(p).site_keys.items() if type(n).__name__ == "LocalJoin"
                for s, keys in enumerate(per_site) if keys}
        assert used and max(used) < max(grid_sites(p))


def test_a_reader_that_cannot_run_over_one_candidate_of_a_shared_node_is_planned_without_it():
    """Two outputs over a replicated source: planning the readers of the twice-computed
    join again over one of its candidates leaves a reader with no placement that runs
    there (every combination a PlacementError); that candidate is passed over (the
    search raised "min() arg is an empty sequence"), and every plan simulates."""
    S0 = td.from_numpy(np.random.default_rng(1).normal(size=(2, 2)), (1, 1), name="S0")
    j = td.join(S0, S0, (0, 1), (0, 1), "add")
    out0 = td.join(td.aggregate(j, (0,), "add"), j, (0,), (1,), "add")
    for objective in ("time", "bytes"):
        check_every_plan((out0, S0), 2, placements={"S0": "all"}, objective=objective)


def _max_received_above_the_join(plan):
    """The most floats any one site receives in any one move of ``plan``'s fold (the
    moves above its join)."""
    from tra_dask.node import toposort
    from tra_dask.physical import LocalJoin

    return max(int(nc.recv_per_site.max()) for n, nc in plan.cost.nodes.items()
               if nc.recv_per_site is not None and any(isinstance(m, LocalJoin) for m in toposort([n.input])))


@pytest.mark.parametrize("bk,sites", [(3, 2), (5, 3), (9, 4), (17, 8), (12, 5), (16, 8), (33, 16)])
@pytest.mark.parametrize("bi,bj", [(2, 2), (1, 1), (1, 3)])
def test_every_reduction_tree_simulates_to_the_reference_and_moves_what_it_predicts(bk, sites, bi, bj):
    """Each CMM plan with a reduction tree (every fan-in the rule offers) simulates to
    the reference and moves exactly its predicted floats: each partial product once,
    as the flat CMM does, plus at most one per output chunk (the last fold's site,
    where the flat fold's is, may hold none).  With one output chunk, the fan-in-2
    tree sends each site at most one partial product per move, where the flat fold
    sends up to sites - 1 into one (with a row of output chunks, one of each)."""
    from tra_dask.optimizer import rules as R
    from tra_dask.optimizer.plan import Plan
    from tra_dask.node import toposort

    rng = np.random.default_rng(100 * bk + sites)
    a = td.from_numpy(rng.standard_normal((4 * bi, 3 * bk)), (4, 3), name="A")
    b = td.from_numpy(rng.standard_normal((3 * bk, 2 * bj)), (3, 2), name="B")
    expr = td.programs.matmul(a, b)
    want = td.evaluate(expr)
    root = td.compile(expr, sites=sites).outputs[0]
    flat = [Plan([t], None, sites, "exact", expr) for t in R.cmm(root)]
    trees = [Plan([t], None, sites, "exact", expr) for t in R.cmm_tree(root)]
    assert len(flat) == 1 and len(trees) == sum(bk > f for f in R.domain.TREE_FANINS)
    out_floats = 4 * bi * 2 * bj
    for p in trees:
        sim = td.simulate(p)
        same_tuples(sim.result, want, f"tree plan, {sites} sites:\n{_describe(p)}\n")
        assert p.cost.floats_moved == sim.floats_moved
        assert flat[0].cost.floats_moved <= p.cost.floats_moved <= flat[0].cost.floats_moved + out_floats
        assert "tree" in p.strategies()[0]
        levels = sum(1 for n in toposort(p.outputs) if R.is_pure_rekey(n))
        assert 1 <= levels <= math.ceil(math.log(bk, 2))
    if bi == 1:  # the tree's groups are of the contracted dim's values: one per row of output chunks
        assert _max_received_above_the_join(trees[0]) <= 4 * 2 * bj
    if bi == bj == 1:
        assert _max_received_above_the_join(trees[0]) == 4 * 2
        assert _max_received_above_the_join(flat[0]) == 4 * 2 * (min(sites, bk) - 1)


# (join kernel, left_on, right_on, the operands' shapes in blocks of (c, c), whether
# chunks may be ragged): contractions of the kinds cmm_tree matches
TREE_JOINS = {
    "matmul": ((1,), (0,), lambda i, k, j: ((i, k), (k, j)), True),
    "matmul_tn": ((0,), (0,), lambda i, k, j: ((k, i), (k, j)), True),
    "matmul_nt": ((1,), (1,), lambda i, k, j: ((i, k), (j, k)), True),
    "mul": ((1,), (0,), lambda i, k, j: ((i, k), (k, j)), False),
    "sub": ((1,), (0,), lambda i, k, j: ((i, k), (k, j)), False),
}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(TREE_JOINS)), st.sampled_from(["add", "max", "min"]),
       st.integers(1, 3), st.integers(3, 24), st.integers(1, 3), st.integers(2, 9), st.integers(0, 2),
       st.integers(0, 2**32 - 1))
def test_reduction_trees_over_random_contractions_simulate_to_the_reference(kernel, agg, bi, bk, bj, sites,
                                                                           ragged, seed):
    """Every plan cmm_tree makes -- over contractions with other join kernels
    (transposed products, elementwise kernels that do not distribute over the fold),
    other associative and commutative folds, ragged edge chunks, 2 to 9 sites, 3 to
    24 values of the contracted dim -- simulates to the reference and moves exactly
    its predicted floats."""
    from tra_dask.optimizer import rules as R
    from tra_dask.optimizer.plan import Plan

    left_on, right_on, shapes, may_be_ragged = TREE_JOINS[kernel]
    c = 3
    cut = ragged if may_be_ragged else 0  # elements short of the last block of each dim
    rng = np.random.default_rng(seed)
    ops = []
    for name, blocks in zip("AB", shapes(bi, bk, bj)):
        shape = tuple(c * b - (cut if b > 1 else 0) for b in blocks)
        ops.append(td.from_numpy(rng.standard_normal(shape), (c, c), name=name))
    A, B = ops
    j = td.join(A, B, left_on, right_on, kernel)
    expr = td.aggregate(j, tuple(d for d in range(3) if d != left_on[0]), agg)
    want = td.evaluate(expr)
    root = td.compile(expr, sites=sites).outputs[0]
    trees = list(R.cmm_tree(root))
    assert len(trees) == sum(bk > f for f in R.domain.TREE_FANINS)
    for t in trees:
        p = Plan([t], None, sites, "exact", expr)
        sim = td.simulate(p)
        same_tuples(sim.result, want, f"{kernel}/{agg} tree plan, {sites} sites:\n{_describe(p)}\n")
        assert p.cost.floats_moved == sim.floats_moved


@pytest.mark.parametrize("program", ["matmul", "relu", "row_sum", "chain", "shared"])
def test_programs_whose_plans_fold_by_a_tree_simulate_to_the_reference(program):
    """Where the time model takes the reduction tree (slow kernels on 8 sites: the flat
    fold's one receiving site is the critical path) inside a larger program -- a map
    above the product, a second product over its result, two outputs sharing it --
    the chosen plan and every alternative simulate to the reference and move their
    predicted floats."""
    from tra_dask.programs import matmul

    rng = np.random.default_rng(5)
    A = td.from_numpy(rng.standard_normal((20, 16 * 20)), (20, 20), name="A")
    B = td.from_numpy(rng.standard_normal((16 * 20, 20)), (20, 20), name="B")
    C = td.from_numpy(rng.standard_normal((20, 30)), (20, 10), name="C")
    ab = matmul(A, B)
    expr = {"matmul": ab, "relu": td.transform(ab, "relu"), "row_sum": td.transform(ab, "row_sum"),
            "chain": matmul(ab, C), "shared": (td.transform(ab, "relu"), matmul(ab, C))}[program]
    cluster = td.ClusterSpec(8, bandwidth=1e7, rates={"blas": 1e6, "elementwise": 1e5}, task_overhead=1e-4)
    plan = check_every_plan(expr, 8, objective="time", cluster=cluster)
    trees = [p for p in [plan, *plan.alternatives] if any("tree" in s for s in p.strategies())]
    assert trees, [p.strategies() for p in [plan, *plan.alternatives]]
    if program in ("matmul", "relu"):
        assert "tree" in plan.strategies()[0]
