"""Eight worker processes, Dask's defaults (the Active Memory Manager on, no kept
cluster spec beyond the suite's): einsums over dask arrays whose chunks the optimizer
changes (the plan re-cuts the blocks where they live), submitted again and again, with
and without ``client.rebalance()`` between submissions — exact results, no placement
error, and the bytes the workers logged equal to the plan's prediction."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import tra_dask as td
from tra_dask.logical import Pieces

from helpers import refetched as _refetched, settle as _settle

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WORKERS = 8
# submissions of one einsum at most: the memory manager's own cycle may drop a fetched copy
# while a plan that reads it runs, and such a run is not compared
ATTEMPTS = 12


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(processes=True, n_workers=WORKERS, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as c:
            c.wait_for_workers(WORKERS)
            yield c


def _inputs(client):
    import dask.array as da
    from distributed import futures_of, wait

    rng = da.random.default_rng(42)
    # chunks no sensible plan keeps: 7 x 3 blocks of uneven sizes, and a batch cut in ones
    X = client.persist(rng.random((140, 96), chunks=((20,) * 7, (40, 40, 16))))
    Y = client.persist(rng.random((96, 120), chunks=((40, 40, 16), (50, 50, 20))))
    B = client.persist(rng.random((4, 30, 40), chunks=(1, 30, 40)))
    C = client.persist(rng.random((4, 40, 20), chunks=(1, 40, 20)))
    # made before the first plan reads where they are (a block still being made has no
    # holder yet, and may be made on the worker a planned transfer was to bring it to)
    wait(futures_of([X, Y, B, C]))
    return X, Y, B, C


CASES = {
    "ij,jk->ik": lambda X, Y, B, C: ((X, Y), X.compute() @ Y.compute()),
    "ij,kj->ik": lambda X, Y, B, C: ((X, X), X.compute() @ X.compute().T),
    "bij,bjk->bik": lambda X, Y, B, C: ((B, C), np.einsum("bij,bjk->bik", B.compute(), C.compute())),
}


@pytest.mark.parametrize("rebalance", [False, True])
def test_einsums_over_rechunked_dask_inputs_on_eight_workers(client, rebalance):
    """Each submission exact; the bytes moved exactly as predicted whenever the plan
    found one copy of each input chunk (Dask's memory manager is run once before each
    submission to drop the copies earlier plans fetched) and no copy was dropped and
    fetched again while it ran (the manager's own cycle, every 2 s, may do that: the
    holders after the run may be the same, the fetch is in the workers' logs; such a
    run is not compared)."""
    assert len(client.scheduler_info(n_workers=-1)["workers"]) == WORKERS
    X, Y, B, C = _inputs(client)
    changed = recut = moved = 0
    for eq, make in CASES.items():
        (a, b), want = make(X, Y, B, C)
        runs = compared = 0
        # at least 5 submissions each, more (up to ATTEMPTS) until 5 are compared
        while runs < 5 or (compared < 5 and runs < ATTEMPTS):
            if rebalance:
                client.rebalance()
            before = _settle(client, [X, Y, B, C])  # (a plan reads each chunk from one holder)
            rf = td.submit(td.einsum(eq, a, b), client=client)
            np.testing.assert_allclose(rf.to_numpy(), want, rtol=1e-12, err_msg=eq)
            runs += 1
            if before is not None and not _refetched(client, rf, before):
                compared += 1
                got = rf.transfers()
                assert got == rf.plan.cost.bytes_moved, (eq, got, rf.plan.explain())
                moved += got > 0
            changed += "chosen" in rf.plan.stage("chunking").note
            recut += any(isinstance(getattr(n, "source", None), Pieces) for n in rf.plan.nodes)
        assert compared >= 5, f"{eq}: only {compared} of {runs} runs found one copy of each input and kept it"
    assert moved, "no compared run moved a byte: the test is not testing predicted transfers"
    assert changed, "no einsum was re-chunked: the test is not testing re-chunked inputs"
    assert recut, "no plan re-cut its inputs' blocks: the test is not testing re-chunked inputs"


def _holders_settled(client, keys, limit: float) -> dict:
    """``{key: holders}`` once every key has one holder, or as it is after ``limit``
    seconds (each copy a plan fetched is dropped as the last task that read it
    finishes: a moment for the scheduler)."""
    import time

    from tra_dask.runtime.cluster import _who_has

    deadline = time.monotonic() + limit
    while True:
        who = _who_has(client, keys)
        if all(len(w) == 1 for w in who.values()) or time.monotonic() > deadline:
            return who
        time.sleep(0.05)


def test_a_loop_over_dask_inputs_finds_them_where_they_were(client):
    """The copies of dask arrays' blocks that a plan's tasks fetched are dropped once
    read (``runtime.keeper``): a loop of submissions leaves one copy of each block, on
    the worker it was on, so Dask's memory manager has no copy to keep in place of the
    original, and the next submission finds the inputs where its cached plan placed
    them (before, 1-11 of 128 blocks had moved after each step on 4 workers, and each
    step was planned again)."""
    from distributed import futures_of

    from tra_dask.runtime.submit import _plan_cache

    X, Y, _, _ = _inputs(client)
    keys = [f.key for f in futures_of([X, Y])]
    want = X.compute() @ Y.compute()
    before = _settle(client, [X, Y])  # (the compute above fetched copies)
    assert before is not None
    cache = _plan_cache(client)
    stayed = hits = moved = 0
    for i in range(6):
        was = cache.hits
        rf = td.submit(td.einsum("ij,jk->ik", X, Y), client=client)
        np.testing.assert_allclose(rf.to_numpy(), want, rtol=1e-12)
        moved += rf.transfers() > 0
        after = _holders_settled(client, keys, 0.5)
        assert all(len(w) == 1 for w in after.values()), f"run {i}: copies left: {after}"
        stayed += after == before
        hits += i > 0 and cache.hits > was
        before = after
    assert moved, "no run moved a byte: no copy was fetched, the test is not testing dropping them"
    # the memory manager's cycle (every 2 s) may drop an original while a plan that read a copy runs
    assert stayed >= 4, f"the inputs moved in {6 - stayed} of 6 runs"
    assert hits >= 3, f"the plan was reused in {hits} of 5 submissions"


def _read_slowly(block, seconds):
    import time

    time.sleep(seconds)
    return float(block.sum())


def test_a_block_read_through_a_memory_manager_cycle_stays_where_it_was(client):
    """A tra_dask task that reads a fetched copy of a dask block for longer than the
    memory manager's cycle (2 s): Dask's own policy keeps the copy in use and drops the
    original; the keeper's policy leaves such a block alone until the task is done,
    and then drops the copy — the block is on its own worker again (it moved every time
    before)."""
    from distributed import wait

    from tra_dask.lowering.keys import task_name
    from tra_dask.runtime.cluster import _ensure_recorder, _who_has

    assert client.amm.running()  # (Dask's defaults)
    assert _ensure_recorder(client)
    home, other = sorted(client.scheduler_info(n_workers=-1)["workers"])[:2]
    block = client.submit(np.ones, 100_000, workers=[home], pure=False)
    wait(block)
    key = (task_name("op", 0, "0123456789"), 0)  # (a tra_dask task's key)
    read = client.submit(_read_slowly, block, 2.5, key=key, workers=[other], allow_other_workers=False)
    assert read.result() == 100_000.0
    assert set(_who_has(client, [block.key])[block.key]) == {home}


def _integer_chunk(key, rows, cols):
    return np.random.default_rng(1000 * key[0] + key[1] + rows).integers(-4, 5, (rows, cols)).astype(np.float64)


def _chunk_of(rows, cols):
    import functools

    return functools.partial(_integer_chunk, rows=rows, cols=cols)


def test_reduction_trees_run_where_planned_and_move_what_they_predict(client):
    """CMM plans whose partial products are folded by a reduction tree (each fan-in
    the rule offers; 11-32 cuts of the contracted dim over 8 workers, one or two
    result chunks), submitted twice each: the exact product of integer-valued chunks,
    every task on the worker the plan named, and the bytes the workers logged equal
    to the plan's prediction."""
    from tra_dask.optimizer import rules as R
    from tra_dask.optimizer.plan import Plan
    from tra_dask.programs import matmul

    runs = 0
    for bk, bj in ((16, 1), (11, 2), (32, 1)):
        A = td.from_function(_chunk_of(40, 30), (40, 30 * bk), (40, 30), "float64", name="A")
        B = td.from_function(_chunk_of(30, 20), (30 * bk, 20 * bj), (30, 20), "float64", name="B")
        expr = matmul(A, B)
        want = td.to_numpy(A) @ td.to_numpy(B)
        trees = list(R.cmm_tree(td.compile(expr, sites=WORKERS).outputs[0]))
        assert len(trees) == 2
        for tree in trees:
            plan = Plan([tree], None, WORKERS, "exact", expr)
            assert "tree" in plan.strategies()[0] and plan.cost.bytes_moved > 0
            for _ in range(2):
                rf = td.submit(plan, client=client)
                np.testing.assert_array_equal(rf.to_numpy(), want)
                ran, planned = rf.ran_on(), rf.planned_on()
                assert set(ran) == set(planned) and all(ran[k] == w for k, w in planned.items())
                assert rf.transfers() == plan.cost.bytes_moved, plan.explain()
                runs += 1
    assert runs == 12


def _sent_chunks(rf) -> list:
    """The keys of the chunks a submission sent from this process (each names the
    worker it was sent to)."""
    from tra_dask.lowering.keys import is_data_key

    return sorted({k for d in rf.lowered.scatter.values() for k in d if is_data_key(k)}, key=str)


def test_chunks_sent_from_the_client_stay_one_copy_where_they_were_sent(client):
    """A plan that broadcasts chunks it sent from this process leaves one copy of each,
    on the worker it was sent to: the copies its tasks fetched are dropped once read
    (``runtime.keeper``), as for a dask array's blocks.  Before, the copies stayed,
    and Dask's memory manager dropped one of the two at random — the original as often
    as not — so a later submission of the cached plan fetched it back (measured 6-30%
    over the prediction in 2-3 of 12 submissions of an FFNN step on 12 workers)."""
    from tra_dask.programs import ffnn_sgd_step

    rng = np.random.default_rng(0)
    N, D, H, L = 154, 107, 81, 42
    x, y = rng.random((N, D)), np.eye(L)[rng.integers(0, L, N)]
    w1, w2 = rng.normal(size=(D, H)) * 0.1, rng.normal(size=(H, L)) * 0.1
    X, Y = td.from_numpy(x, (134, 62), name="X"), td.from_numpy(y, (134, 33), name="Y")
    W1, W2 = td.from_numpy(w1, (62, 54), name="W1"), td.from_numpy(w2, (54, 33), name="W2")
    expr = ffnn_sgd_step(X, Y, W1, W2, 0.1)
    want = [td.to_numpy(r) for r in expr]
    moved = 0
    for i in range(3):
        rf1, rf2 = td.submit(expr, client=client)
        np.testing.assert_allclose(rf1.to_numpy(), want[0], rtol=1e-12)
        np.testing.assert_allclose(rf2.to_numpy(), want[1], rtol=1e-12)
        got = rf1.transfers()
        # one plan, one window: each output counts the whole submission, what the plan predicts
        assert got == rf2.transfers() == rf1.plan.cost.bytes_moved, (i, got, rf2.transfers(),
                                                                     rf1.plan.cost.bytes_moved)
        moved += got > 0
        sent = _sent_chunks(rf1)
        assert sent, "the plan sent no chunk: the test is not testing them"
        who = _holders_settled(client, sent, 1.0)
        extra = {k: w for k, w in who.items() if list(w) != [k[1]]}
        assert not extra, f"submission {i}: chunks not (only) on the worker they were sent to: {extra}"
        del rf1, rf2
    assert moved, "no submission moved a byte: no chunk was fetched, the test is not testing the copies"
