"""Re-cuts (:mod:`tra_dask.frontend.recut`): an axis cut again as TRA — slices off
chunk boundaries, steps, reversals, a dask input's blocks changed by the plan —
equal to numpy's result, planned and simulated like any other work, and run on a
real cluster with the bytes the plan predicts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tra_dask as td
from tra_dask import logical as L
from tra_dask.frontend.recut import aligned, recut
from tra_dask.frontend.run import build_local
from tra_dask.logical import Pieces, piece_table

from helpers import refetched, settle


def _slices(n: int):
    """Every kind of slice of an axis of ``n``: both signs of start, stop and step,
    past the ends, empty ones left out."""
    points = [None, *sorted({0, 1, n // 3, n // 2, n - 1, n, -1, -n // 2, -n, n + 3})]
    for start, stop, step in itertools.product(points, points, (1, 2, 3, -1, -2, -7)):
        if len(range(*slice(start, stop, step).indices(n))):
            yield slice(start, stop, step)


def test_pieces_cover_every_output_element_once():
    for n, block, out in [(10, 4, 4), (17, 5, 2), (17, 5, 7), (100, 7, 13), (1, 1, 1), (64, 8, 8)]:
        for sl in _slices(n):
            first, _, step = sl.indices(n)
            length = len(range(*sl.indices(n)))
            t = piece_table(n, block, first + step * np.arange(length), out, step)
            taken = []
            for j, q, i, start, count, _ in t.tolist():
                assert 0 <= start < block and count >= 1
                taken += [i * block + start + c * step for c in range(count)]
                assert all(o // block == i for o in taken[-count:])  # a piece stays in its block
            assert taken == list(range(n))[sl], (n, block, out, sl)  # in output order, each once
            js = t[:, 0]
            per_block = np.bincount(js, weights=t[:, 4]).astype(int).tolist()
            assert per_block == [min(out, length - j * out) for j in range(-(-length // out))]
            for j in set(js.tolist()):
                assert sorted(t[js == j, 1].tolist()) == list(range(int((js == j).sum())))


def test_a_progressions_pieces_come_from_the_block_boundaries():
    """The pieces of ``first + o*step`` (a slice's or a reshape's re-cut) from the block
    boundaries alone equal those of the elements listed, on random extents, block
    grids (ragged, with empty blocks), steps and output blocks — and an axis of 5·10⁸
    elements is a few rows, not an array of that length."""
    rng = np.random.default_rng(11)
    n = 0
    while n < 3000:
        extent = int(rng.integers(1, 60))
        if rng.random() < 0.3:
            cuts = np.sort(rng.integers(0, extent + 1, size=int(rng.integers(1, 6))))
            block = tuple(int(v) for v in np.diff(np.r_[0, cuts, extent]))
        else:
            block = int(rng.integers(1, 12))
        step = int(rng.choice([1, 1, 2, 3, -1, -2, 5, -4]))
        first = int(rng.integers(0, extent))
        most = (extent - 1 - first) // step + 1 if step > 0 else first // -step + 1
        length, out_block = int(rng.integers(1, most + 1)), int(rng.integers(1, 12))
        want = piece_table(extent, block, first + step * np.arange(length), out_block, step)
        got = piece_table(extent, block, L.Progression(first, step, length), out_block, step)
        assert np.array_equal(want, got), (extent, block, first, step, length, out_block)
        n += 1
    big = piece_table(5 * 10**8, 10**7, L.Progression(3, 1, 5 * 10**8 - 3), 3 * 10**7, 1)
    assert len(big) <= 50 + 17 and big[:, 4].sum() == 5 * 10**8 - 3  # (at most input + output blocks)


def test_recut_of_a_relation_equals_numpy():
    rng = np.random.default_rng(0)
    cases = 0
    for n, block, out in [(10, 4, 3), (17, 5, 7), (9, 2, 9)]:
        a = rng.random((n, 3))
        X = L.from_numpy(a, (block, 2), name="X")
        for sl in _slices(n):
            first, _, step = sl.indices(n)
            want = a[sl]
            got = L.to_numpy(recut(X, 0, n, block, first, step, len(want), out))
            np.testing.assert_array_equal(got, want, err_msg=f"{n} {block} {out} {sl}")
            cases += 1
    assert cases > 200


def test_a_recut_reads_only_the_blocks_it_takes_from():
    X = L.from_numpy(np.arange(40.0), 4, name="X")
    r = recut(X, 0, 40, 4, 9, 10, 4, 4)  # elements 9, 19, 29, 39: blocks 2, 4, 7, 9
    np.testing.assert_array_equal(L.to_numpy(r), [9.0, 19.0, 29.0, 39.0])
    assert r.ntuples == 1 and r.input.ntuples == 4


def test_thousands_of_skipped_blocks_are_one_predicate():
    """A stride that skips every other block of thousands reads the others through
    one set-membership predicate (a chain of ``|`` as long as the set overflowed
    Python's recursion limit)."""
    from tra_dask.keys import In

    a = np.arange(6000.0)
    r = recut(L.from_numpy(a, 2, name="X"), 0, 6000, 2, 0, 4, 1500, 2)
    np.testing.assert_array_equal(L.to_numpy(r), a[::4])
    (f,) = [n for n in L.toposort([r]) if isinstance(n, L.Filter)]
    assert isinstance(f.pred, In) and len(f.pred.values) == 1500


def test_aligned_recuts_are_left_to_a_filter():
    assert aligned(10, 4, 4, 1, 6, 4) and aligned(10, 4, 0, 1, 8, 4)
    assert not aligned(10, 4, 4, 1, 5, 4)       # stops inside a block
    assert not aligned(10, 4, 3, 1, 6, 4)       # starts inside one
    assert not aligned(10, 4, 4, 2, 3, 4)       # a step
    assert not aligned(10, 4, 0, 1, 10, 5)      # another block size


def test_pieces_are_metadata_and_refuse_a_bad_geometry():
    p = Pieces(10, 4, np.arange(3, 9), 4, 1, name="p")
    assert p.nbytes == 0 and p.ntuples == 4
    assert p.load((1, 0, 1)).shape == (0, 3, 0)  # block 1 gives output block 0 three elements from 0
    with pytest.raises(ValueError, match=r"outside an extent of 10"):
        piece_table(10, 4, np.arange(3, 11), 4)


ARRAYS = {
    "2-D": (np.arange(70.0 * 45).reshape(70, 45), [(slice(3, 61), slice(None)), (slice(None, None, -1), slice(2, 40, 3)),
                                                    (slice(68, 1, -4), slice(-5, None)), (slice(7, 8), 4)]),
    "3-D": (np.arange(9.0 * 10 * 11).reshape(9, 10, 11), [(slice(1, 8), slice(None, None, -2), slice(3, 11)),
                                                         (Ellipsis, slice(9, 0, -3))]),
    "1-D int": (np.arange(101), [slice(5, 96, 6), slice(None, None, -1), slice(50, None)]),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_slices_of_arrays_equal_numpy_in_any_chunks_on_any_sites(name):
    a, indices = ARRAYS[name]
    for chunks, index in itertools.product([None, 4, 7, tuple(max(1, n // 3) for n in a.shape)], indices):
        x = td.from_array(a, chunks=chunks)
        sites = 3 if chunks is None else 1  # (the chunk choice on 3 sites; given chunks re-cut as they are)
        want = a[index]
        rel, _ = build_local(x[index], sites=sites)
        np.testing.assert_array_equal(td.to_numpy(rel), want, err_msg=f"{chunks} {sites} {index}")


def test_a_sliced_operand_of_a_contraction_is_recut_when_its_chunks_are_fixed():
    rng = np.random.default_rng(3)
    a, b = rng.random((60, 50)), rng.random((50, 40))
    x = td.from_array(a, chunks=(16, 16))
    y = td.from_array(b)
    e = x[5:57, 3:43] @ y[7:47]
    rel, plan = build_local(e, sites=4)
    np.testing.assert_allclose(td.to_numpy(rel), a[5:57, 3:43] @ b[7:47], rtol=1e-12)
    assert any(isinstance(n, Pieces) for n in L.toposort([rel]))


def test_recut_plans_simulate_to_the_evaluator_with_the_moves_they_predict():
    """Data whose blocks are placed (as a cluster's are), re-cut: the optimized plan's
    simulation gives the evaluator's chunks and moves the floats its cost counts."""
    rng = np.random.default_rng(5)
    checked = moved = 0
    for n, block, out, sl, sites in [(40, 8, 8, slice(3, 37), 4), (40, 8, 5, slice(None, None, -1), 3),
                                     (33, 4, 10, slice(2, 31, 3), 2), (64, 16, 16, slice(60, 2, -5), 4)]:
        a = rng.random((n, 6))
        X = L.from_numpy(a, (block, 6), name="X")
        first, _, step = sl.indices(n)
        want = a[sl]
        r = recut(X, 0, n, block, first, step, len(want), out)
        place = {k: k[0] % sites for k in X.keys}  # block i on site i mod sites
        plan = td.optimize(r, sites=sites, placements={"X": place})
        sim = td.simulate(plan)
        np.testing.assert_array_equal(td.to_numpy(r, sim.result), want)
        assert sim.floats_moved == plan.cost.floats_moved
        checked += 1
        moved += sim.floats_moved > 0
    assert checked == 4 and moved >= 2  # placed blocks: the pieces do move


def test_the_chunk_choice_prices_a_recut():
    """The estimate of a chunking that re-cuts a slice counts the pieces' tasks and
    moves; one whose blocks fall on the slice's cut points counts none."""
    from tra_dask.frontend.chunking import AxisClasses
    from tra_dask.frontend.estimate import Estimator
    from tra_dask.optimizer.cluster import ClusterSpec

    x = td.from_array(np.ones(4096))[1024:3072]
    cl = AxisClasses([x._node])
    est = Estimator(cl, 4, ClusterSpec(sites=4))
    (ci,) = range(len(cl.classes))
    assert 512 in cl.candidates(ci, 4) and 1000 not in cl.candidates(ci, 4)
    on, off = est([512]), est([800])
    assert on < off


def test_slices_and_rechunked_dask_inputs_run_on_a_cluster_as_predicted(client):
    """Slices off the blocks of a persisted dask array, and an einsum whose chunking
    differs from the inputs': exact results, the re-cut inside the plan (no dask
    rechunk: the plan reads the persisted blocks), and the bytes the workers moved
    equal to the plan's prediction (on inputs of one copy a chunk: tests/helpers.settle)."""
    import dask.array as da
    from distributed import Future

    rng = da.random.default_rng(11)
    X = client.persist(rng.random((90, 64), chunks=(20, 32)))
    Y = client.persist(rng.random((64, 50), chunks=(30, 25)))
    # the values, block by block to the client: X.compute() would first bring X's blocks
    # together on one worker, transfers that the first submission's log (a busy host's
    # clock is tens of ms off) could count as its own
    x, y = (np.block(client.gather([[Future(k, client) for k in row] for row in a.__dask_keys__()])) for a in (X, Y))
    cases = [(td.from_array(X)[3:88:2, ::-1], x[3:88:2, ::-1]), (td.einsum("ij,jk->ik", X, Y), x @ y),
             (td.from_array(X)[5:85] @ td.from_array(Y), x[5:85] @ y)]
    for e, want in cases:
        for _ in range(3):  # until a run found one copy of each input chunk and kept it
            # (a plan places each chunk on one holder: the copies an earlier case fetched are
            # dropped first, and a run during which the memory manager dropped and fetched
            # one again is not compared)
            before = settle(client, [X, Y])
            rf = td.submit(e, client=client)
            np.testing.assert_allclose(rf.to_numpy(), want, rtol=1e-12)
            sources = [n.source for n in rf.plan.nodes if hasattr(n, "source")]
            assert not any("rechunked" in s.name for s in sources)
            assert any(isinstance(s, Pieces) for s in sources), rf.plan.explain()
            if before is not None and not refetched(client, rf, before):
                assert rf.transfers() == rf.plan.cost.bytes_moved, rf.plan.explain()
                break
        else:
            pytest.fail("no run of 3 found one copy of each input chunk and kept it")


RNG = np.random.default_rng(7)
A3 = RNG.random((13, 10, 6))
M = RNG.random((9, 12))
OPS = {  # name: (tra_dask on td arrays x (3-d, chosen chunks) and m (given chunks of 4), numpy on a3 and m)
    "x[idx]": lambda x, m, np: x[np.array([3, -1, 0, 3, 12, 7])],
    "x[:, list]": lambda x, m, np: x[:, [1, 5, 2, 9, 9]],
    "x[0, :, list] (numpy puts the list's axis first)": lambda x, m, np: x[0, :, [1, 2]],
    "x[list, :, 0]": lambda x, m, np: x[[1, 2], :, 0],
    "x[..., list]": lambda x, m, np: x[..., [5, 0]],
    "x[2-d index]": lambda x, m, np: x[np.array([[1, 2], [3, 4]])],
    "m[:, mask]": lambda x, m, np: m[:, np.arange(12) % 3 == 1],
    "take axis 1": lambda x, m, np: np.take(m, [5, 1, 1, 11], axis=1),
    "take flattened": lambda x, m, np: np.take(m, [5, 100, 0]),
    "flip": lambda x, m, np: np.flip(m),
    "flip axis": lambda x, m, np: np.flip(x, (0, 2)),
    "flipud": lambda x, m, np: np.flipud(m),
    "fliplr": lambda x, m, np: np.fliplr(m),
    "roll": lambda x, m, np: np.roll(m, 3, axis=1),
    "roll flattened": lambda x, m, np: np.roll(m, -5),
    "roll two axes": lambda x, m, np: np.roll(x, (2, -13), axis=(0, 1)),
    "repeat": lambda x, m, np: np.repeat(m, 3, axis=0),
    "repeat counts": lambda x, m, np: np.repeat(m, np.arange(12), axis=1),
    "repeat flattened": lambda x, m, np: np.repeat(m, 2),
    "tile": lambda x, m, np: np.tile(m, (2, 3)),
    "tile new axis": lambda x, m, np: np.tile(m, (2, 1, 2)),
    "tril": lambda x, m, np: np.tril(m),
    "triu k": lambda x, m, np: np.triu(m, -2),
    "tril batched": lambda x, m, np: np.tril(x, 3),
    "reshape of given chunks": lambda x, m, np: m.reshape(3, 36),
    "concatenate of given chunks": lambda x, m, np: np.concatenate([m, m[::-1]], axis=0),
    "flip then matmul": lambda x, m, np: np.flip(m, 1) @ m.T,
    "take then sum": lambda x, m, np: np.take(x, [4, 4, 0], axis=1).sum(axis=(0, 1)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_gathers_equal_numpy(name):
    want = OPS[name](A3, M, np)
    x, m = td.from_array(A3), td.from_array(M, chunks=4)
    e = OPS[name](x, m, np)
    assert isinstance(e, td.Array) and e.shape == want.shape and e.dtype == want.dtype
    rel, _ = build_local(e, sites=3)
    np.testing.assert_allclose(td.to_numpy(rel), want, rtol=1e-13, err_msg=name)


def test_gathers_refuse_what_they_cannot_do_clearly():
    x = td.from_array(np.ones((4, 5)))
    with pytest.raises(IndexError, match=r"index 9 is out of bounds for an axis of extent 5"):
        np.take(x, [1, 9], axis=1)
    with pytest.raises(IndexError, match=r"one integer or boolean array per index"):
        x[[0, 1], [1, 2]]
    with pytest.raises(IndexError, match=r"boolean index must be 1-d and as long as its axis \(4\)"):
        x[np.ones((4, 5), bool)]
    with pytest.raises(TypeError, match=r"indexing by a td.Array is not supported"):
        x[x > 0]
    with pytest.raises(ValueError, match=r"repeats must be non-negative ints"):
        np.repeat(x, -1)
    with pytest.raises(ValueError, match=r"numpy.tril: needs an array of rank 2 or more"):
        np.tril(td.from_array(np.ones(3)))


def test_a_gather_adds_no_chunking_search():
    """A take's axis is cut as its input's (one class): the chunk choice searches the
    classes it searched before."""
    from tra_dask.frontend.chunking import AxisClasses

    x = td.from_array(np.ones((64, 32)))
    before = len(AxisClasses([(x @ x.T)._node]).classes)
    after = len(AxisClasses([(np.take(x, np.arange(63, -1, -1), axis=0) @ x.T)._node]).classes)
    assert after == before


def test_a_take_over_a_dask_input_runs_on_a_cluster_as_predicted(client):
    import dask.array as da

    X = client.persist(da.random.default_rng(3).random((50, 40), chunks=(10, 20)))
    idx = np.array([49, 0, 13, 13, 27, 8])
    rf = td.submit(np.take(td.from_array(X), idx, axis=0) @ td.from_array(X).T, client=client)
    assert rf.transfers() == rf.plan.cost.bytes_moved, rf.plan.explain()
    # (X gathered after: dask's compute concatenates its chunks on a worker, moving them)
    x = X.compute()
    np.testing.assert_allclose(rf.to_numpy(), x[idx] @ x.T, rtol=1e-12)


def test_index_arrays_beside_an_ellipsis_and_slices_of_given_chunks_made_whole():
    a = np.arange(24.0).reshape(2, 3, 4)
    x = td.from_array(a)
    for got, want in [(x[..., np.array([2, 0])], a[..., [2, 0]]), (x[np.array([1, 0]), ...], a[[1, 0], ...]),
                      (x[..., np.array([True, False, True, False])], a[..., [True, False, True, False]])]:
        np.testing.assert_array_equal(td.to_numpy(got), want)
    m = np.arange(108.0).reshape(9, 12)
    g = td.from_array(m, chunks=4)  # given chunks; each operand below is a slice or take of them
    for got, want in [(g[4:8].reshape(-1), m[4:8].reshape(-1)),
                      (np.concatenate([g[2:4], g[0:2]]), np.concatenate([m[2:4], m[0:2]])),
                      (np.concatenate([g[:, 4:], g[:, :4]], axis=1), np.concatenate([m[:, 4:], m[:, :4]], axis=1)),
                      (np.take(g, 1, axis=0), m[1]), (np.take(g, [[0, 1], [2, 3]], axis=0), m[[[0, 1], [2, 3]]])]:
        rel, _ = build_local(got, sites=3)
        np.testing.assert_array_equal(td.to_numpy(rel), want)


def _resident(x, name):
    """A relation over a dask array's blocks as the runtime makes one (a ClusterSource
    whose chunks are whatever dask's are, empty ones included), its blocks computed here."""
    from tra_dask.types import RelationType

    store = {(x.name,) + idx: np.asarray(x.blocks[idx].compute(scheduler="sync")) for idx in np.ndindex(*x.numblocks)}
    keys = {idx: (x.name,) + idx for idx in np.ndindex(*x.numblocks)}
    shapes = np.array([[x.chunks[d][i] for d, i in enumerate(idx)] for idx in keys], dtype=np.int64)
    table, ids = np.unique(shapes, axis=0, return_inverse=True)
    t = RelationType(np.array(list(keys), dtype=np.int64).reshape(len(keys), x.ndim), ids.reshape(-1),
                     [tuple(r) for r in table.tolist()], x.dtype)
    return L.ClusterSource(tuple(sorted(keys.items())), t, name, store.__getitem__)


@pytest.mark.parametrize("chunks", [((5, 0, 5), (4,)), ((10, 0), (4,)), ((3, 3, 4), (1, 3)), ((2, 8), (4,))])
def test_dask_blocks_irregular_or_empty_are_recut_by_the_plan(chunks):
    """``runtime.arrays``'s dask source: the array's blocks where they are, re-cut to
    the chunking chosen (:func:`~tra_dask.frontend.recut.rechunk`), whatever dask's
    chunks are — irregular, or with empty blocks (a boolean selection's)."""
    import dask.array as da

    from tra_dask.frontend.recut import rechunk
    from tra_dask.frontend.run import plan_chunking
    from tra_dask.optimizer.cluster import ClusterSpec
    from tra_dask.optimizer.target import Target

    a = np.arange(40.0).reshape(10, 4)
    X = da.from_array(a, chunks=chunks)
    src = _resident(X, "X")
    target = Target(3, cluster=ClusterSpec(sites=3))
    for f in (lambda m: m, lambda m: m[::-1], lambda m: m @ m.T, lambda m: m.reshape(-1)):
        rel, _, _ = plan_chunking(f(td.from_array(X)), target, lambda r, o: td.optimize(r, target, options=o),
                                  lambda arr, blocks, name: rechunk(src, arr.chunks, tuple(blocks), name=name))
        np.testing.assert_array_equal(td.to_numpy(rel), f(a))
