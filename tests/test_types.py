"""What every node knows without touching arrays, structural identity, shared
subexpressions and multi-output evaluation."""

import numpy as np
import pytest

import tra_dask as td
from tra_dask.keys import k0, k1
from tra_dask.types import RelationType
from tra_dask.programs import matmul


class CountingLoader:
    """A from_function loader that records every key it is asked for."""

    def __init__(self, shape, chunks, dtype="float64"):
        self.shape, self.chunks, self.dtype, self.calls = shape, chunks, dtype, []

    def __call__(self, key):
        self.calls.append(key)
        ext = tuple(min(c, n - k * c) for k, c, n in zip(key, self.chunks, self.shape))
        return np.full(ext, float(sum(key) + 1), dtype=self.dtype)


def test_metadata_without_touching_arrays():
    f = CountingLoader((10, 7), (4, 3), "float32")
    A = td.from_function(f, (10, 7), (4, 3), "float32", name="A")
    B = td.from_function(CountingLoader((7, 5), (3, 5), "float32"), (7, 5), (3, 5), "float32", name="B")
    C = matmul(A, B)
    J = C.input
    assert (A.key_arity, A.ntuples, A.frontier, A.dtype) == (2, 9, (3, 3), np.float32)
    assert A.chunk_shape((2, 2)) == (2, 1) and A.chunk_shape((0, 0)) == (4, 3)
    assert A.nbytes == 10 * 7 * 4
    assert J.key_arity == 3 and J.ntuples == 9 * 1 and J.frontier == (3, 3, 1)
    assert J.chunk_shape((2, 1, 0)) == (2, 5)
    assert C.keys == [(0, 0), (1, 0), (2, 0)] and C.chunk_shape((2, 0)) == (2, 5)
    assert C.nbytes == 10 * 5 * 4
    assert C.type.chunk_shapes() == {(0, 0): (4, 5), (1, 0): (4, 5), (2, 0): (2, 5)}
    assert f.calls == []  # typing and building never called the loader
    td.evaluate(C)
    assert sorted(f.calls) == A.keys  # evaluation loads each chunk once


def test_type_at_paper_scale_is_fast_and_exact():
    # 40,000^2 general matmul with 400x400 chunks: 10^4 tuples per input, 10^6 join tuples

    def boom(key):
        raise AssertionError("planning must not load data")

    A = td.from_function(boom, (40_000, 40_000), 400, "float64", name="X")
    B = td.from_function(boom, (40_000, 40_000), 400, "float64", name="Y")
    C = matmul(A, B)
    assert A.ntuples == 10_000 and C.input.ntuples == 1_000_000 and C.ntuples == 10_000
    assert A.nbytes == 40_000**2 * 8 and C.input.nbytes == 100 * 40_000**2 * 8


def test_edge_chunks_have_true_shapes():
    R = td.from_numpy(np.zeros((5, 7, 3)), (2, 3, 3))
    assert R.frontier == (3, 3, 1)
    assert R.chunk_shape((2, 2, 0)) == (1, 1, 3)
    assert R.chunk_shape((0, 2, 0)) == (2, 1, 3)
    assert R.type.bound == (2, 3, 3)
    assert R.nbytes == 5 * 7 * 3 * 8
    T = td.tile(R, 1, 2)  # chunks of 3 columns -> tiles of 2 and 1; edge chunk of 1 -> one tile
    assert T.chunk_shape((0, 0, 0, 1)) == (2, 1, 3)
    assert (0, 2, 0, 1) not in T.type  # a hole: the 1-column edge chunk has one tile only
    assert not T.type.is_continuous


def test_structural_equality_and_hash():
    x = np.ones((4, 4))
    A1, A2 = td.from_numpy(x, 2, name="A"), td.from_numpy(x, 2, name="A")
    e1 = td.aggregate(td.join(A1, A1, (1,), (0,), "matmul"), (0, 2), "add")
    e2 = td.aggregate(td.join(A2, A2, [1], [0], "matmul"), [0, 2], "add")
    assert e1 == e2 and hash(e1) == hash(e2)
    assert e1 != td.aggregate(td.join(A1, A1, (1,), (0,), "matmul"), (2, 0), "add")
    assert td.rekey(A1, (k1, k0)) == td.rekey(A1, td.keys.project(1, 0))
    assert td.filter(A1, k0 == k1) == td.filter(A1, k0 == k1)
    assert td.filter(A1, k0 == k1) != td.filter(A1, k0 != k1)
    assert td.from_numpy(x.copy(), 2) != A1  # arrays compare by identity
    assert len({e1, e2}) == 1


def test_repr_reads_like_the_call(RA):
    e = td.transform(td.rekey(td.filter(RA, k0 == k1), k0), "diag")
    assert repr(e) == "transform(rekey(filter(R_A, pred=k0 == k1), key_fn=key(k0)), kernel='diag')"


def test_shared_subexpression_evaluated_once():
    f = CountingLoader((6, 6), (2, 2))
    A = td.from_function(f, (6, 6), 2, "float64", name="A")
    AA = matmul(A, A)  # A used twice in one expression
    out = td.evaluate((AA, td.transform(AA, "neg"), matmul(A, A)))  # the third equals the first
    assert sorted(f.calls) == A.keys  # each chunk loaded once across all outputs
    a = td.to_numpy(A)
    np.testing.assert_allclose(td.to_numpy(AA, out[0]), a @ a)
    np.testing.assert_allclose(td.to_numpy(AA, out[1]), -(a @ a))


def test_multi_output_structures():
    A = td.from_numpy(np.arange(16.0).reshape(4, 4), 2, name="A")
    s, m = td.aggregate(A, (), "add"), td.aggregate(A, (), "max")
    tup = td.evaluate((s, m))
    assert isinstance(tup, tuple) and len(tup) == 2
    np.testing.assert_array_equal(tup[0][()], [[20, 24], [36, 40]])
    np.testing.assert_array_equal(tup[1][()], [[10, 11], [14, 15]])
    d = td.evaluate({"sum": s, "max": m})
    assert list(d) == ["sum", "max"]
    np.testing.assert_array_equal(d["max"][()], tup[1][()])
    lst = td.evaluate([s])
    assert isinstance(lst, list) and len(lst) == 1
    with pytest.raises(TypeError, match="item 1 is a int"):
        td.evaluate((s, 3))


def test_methods_match_functions(RA):
    assert RA.join(RA, (1,), (0,), "matmul").aggregate((0, 2), "add") == matmul(RA, RA)
    assert RA.tile(1, 1).concat(2, 1) == td.concat(td.tile(RA, 1, 1), 2, 1)
    np.testing.assert_array_equal(RA.transform("neg").to_numpy(), -td.to_numpy(RA))
    assert RA.filter(k0 == 0).rekey(k1).evaluate().keys() == {(0,), (1,)}


def test_to_numpy_keeps_unsplit_trailing_dims():
    x = np.arange(12.0).reshape(3, 4)
    R = td.rekey(td.from_numpy(x, (1, 4)), k0)  # keys (i,), chunks (1, 4)
    np.testing.assert_array_equal(td.to_numpy(R), x)


def test_to_numpy_of_single_chunk_with_empty_key(RA):
    from helpers import PAPER_A
    np.testing.assert_array_equal(td.to_numpy(td.aggregate(RA, (), "add")), PAPER_A[:2, :2] + PAPER_A[:2, 2:] + PAPER_A[2:, :2] + PAPER_A[2:, 2:])


# -- typing limits (issue 14): linear in the chunks at any rank, bounded key sets -----

def test_high_rank_relations_type_promptly():
    # one chunk shape per occurring edge pattern, never one per 2**rank code: rank 22
    # took 24 s and rank 40 never ended
    import time

    t0 = time.monotonic()
    R40 = td.from_function(lambda k: np.zeros((1,) * 40), (1,) * 40, 1, "float64", name="R40")
    R22 = td.from_numpy(np.broadcast_to(np.float64(0), (3,) * 22), 3, name="R22")  # a view: no data
    edges = td.from_function(lambda k: None, (3,) + (2,) * 39, (2,) * 40, "float32", name="E")
    assert time.monotonic() - t0 < 10
    assert (R40.ntuples, R40.frontier, R40.type.shapes) == (1, (1,) * 40, ((1,) * 40,))
    assert R22.ntuples == 1 and R22.chunk_shape((0,) * 22) == (3,) * 22
    assert edges.ntuples == 2 and edges.chunk_shape((1,) + (0,) * 39) == (1,) + (2,) * 39
    assert td.to_numpy(R40).shape == (1,) * 40


def test_grid_edge_chunk_shapes():
    from tra_dask.types import grid_type

    t = grid_type((5, 5, 5), (2, 5, 3), "float64")
    assert t.chunk_shapes() == {(0, 0, 0): (2, 5, 3), (0, 0, 1): (2, 5, 2), (1, 0, 0): (2, 5, 3),
                                (1, 0, 1): (2, 5, 2), (2, 0, 0): (1, 5, 3), (2, 0, 1): (1, 5, 2)}


@pytest.mark.parametrize("build", [
    lambda: td.from_function(lambda k: None, (10**5, 10**5), 1, "float64", name="huge"),
    lambda: td.from_function(lambda k: None, (2,) * 40, 1, "float64", name="huge"),
    lambda: td.join(td.from_function(lambda k: None, (10**4,), 1, "f8", name="huge"),
                    td.from_function(lambda k: None, (10**4,), 1, "f8", name="other"), (), (), "mul"),
    lambda: td.rekey(td.from_function(lambda k: None, (10**6,), 1, "f8", name="huge"), td.keys.insert_dim(0, 10**3)),
    lambda: td.tile(td.from_function(lambda k: None, (10**8,), 10**8, "f8", name="huge"), 0, 1),
])
def test_key_sets_past_the_limit_are_a_clear_error(build):
    # a ValueError naming the relation and the limit, not a MemoryError from numpy
    with pytest.raises(ValueError, match=r"huge.*tuples of key arity \d+; a relation may hold at most [\d,]+ tuples"
                                         r".*use bigger chunks"):
        build()


def test_the_limit_is_per_arity(monkeypatch):
    import tra_dask.types as types

    monkeypatch.setattr(types, "MAX_KEY_ENTRIES", 1000)
    assert types.max_tuples(0) == types.max_tuples(1) == 1000 and types.max_tuples(2) == 500
    assert td.from_function(lambda k: None, (1000,), 1, "f8").ntuples == 1000  # at the limit: fine
    assert td.from_function(lambda k: None, (20, 25), 1, "f8").ntuples == 500
    with pytest.raises(ValueError, match="1,001 tuples of key arity 1; a relation may hold at most 1,000"):
        td.from_function(lambda k: None, (1001,), 1, "f8")
    with pytest.raises(ValueError, match="at most 500 tuples"):
        td.from_function(lambda k: None, (20, 26), 1, "f8")


@pytest.mark.parametrize("seed", range(6))
def test_a_join_on_every_key_dim_of_equal_keys_types_as_the_general_rule(seed):
    """An elementwise join whose two sides hold the same keys row for row pairs each
    tuple with its row (a fast path: a 3-D multiply's local join of 10⁶-10⁷ tuples
    skipped the key codes' sort); the type equals the general rule's, which the
    same join reached through permuted key dims takes, and a join of unequal keys
    (a side filtered) still takes the general rule."""
    from tra_dask.keys import permute

    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(3, 9, size=3))
    chunks = tuple(int(v) for v in rng.integers(1, 4, size=3))
    A = td.from_numpy(np.ones(shape), chunks, name="A")
    B = td.from_numpy(np.ones(shape), chunks, name="B")
    fast = td.join(A, B, (0, 1, 2), (0, 1, 2), "add")
    # the same pairs through B's key dims permuted: its rows ordered otherwise (the general rule)
    Bp = td.rekey(B, permute(2, 0, 1))
    general = td.join(A, Bp, (0, 1, 2), (1, 2, 0), "add")
    assert fast.type == general.type == A.type
    got = td.evaluate(fast)
    assert set(got) == set(td.evaluate(A)) and all(np.all(v == 2) for v in got.values())
    odd = td.filter(B, (k0 + k1) % 2 == 0)  # fewer keys: the general rule
    part = td.join(A, odd, (0, 1, 2), (0, 1, 2), "add")
    assert sorted(map(tuple, part.type.keys.tolist())) == sorted(td.evaluate(odd, check=False))


def test_one_shape_ids_and_dense_key_grids_hold_no_copies(monkeypatch):
    """A relation whose chunks all have one shape keeps its shape ids as a read-only
    view of one 0, and relations whose keys are every key below one frontier, in
    order, hold one array of them (the 3-D multiply's replicas and its join): the
    same keys, read-only, whichever relation made them first."""
    from tra_dask import types as types_module
    monkeypatch.setattr(types_module, "SHARE_FROM", 1)
    grid = np.stack(np.meshgrid(np.arange(3), np.arange(4), np.arange(2), indexing="ij"), -1).reshape(-1, 3)
    a = RelationType(grid.copy(), np.zeros(len(grid), int), [(2, 2)], "float64")
    b = RelationType(grid[::-1].copy(), np.zeros(len(grid), int), [(2, 2)], "float64")  # (sorted on the way in)
    assert a.keys is b.keys and not a.keys.flags.writeable
    np.testing.assert_array_equal(a.keys, grid)
    assert a.shape_ids.strides == (0,) and not a.shape_ids.flags.writeable and a.shape_ids.tolist() == [0] * 24
    assert a.nelements == 24 * 4 and a.chunk_sizes.tolist() == [4] * 24
    holes = RelationType(grid[1:].copy(), np.zeros(len(grid) - 1, int), [(2, 2)], "float64")  # not every key
    assert holes.keys is not a.keys and holes.keys.tolist() == grid[1:].tolist()
    two = RelationType(grid.copy(), np.arange(len(grid)) % 2, [(2, 2), (1, 2)], "float64")
    assert two.shape_ids.strides != (0,) and two.shape_ids.tolist() == (np.arange(24) % 2).tolist()
