"""Shared test data and checks."""
import subprocess

import numpy as np

import tra_dask as td

# The paper's matrix A (§2.2) and its tensor relation R_A with 2x2 chunks.
PAPER_A = np.array(
    [[1, 2, 5, 6], [3, 4, 7, 8], [9, 10, 13, 14], [11, 12, 15, 16]], dtype=np.float64
)
# The paper's matrix B (§3.1), stored by 2x4 column blocks as R_B.
PAPER_B = np.array(
    [[1, 2, 5, 6, 9, 10, 13, 14], [3, 4, 7, 8, 11, 12, 15, 16]], dtype=np.float64
)


def assert_chunks_equal(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"chunk {k}")


# Kernels that lie about their output (test modules import them from here, once: conftest keeps
# the doctest collection from importing this file again; CLI workers find it on PYTHONPATH)
@td.kernel(name="liar", shape="same")
def liar(x):
    return x[:, :1]  # declares "same" but returns one column


@td.kernel(name="float32_liar", shape="same")
def dtype_liar(x):
    return x.astype(np.float32)


@td.kernel(name="binary_liar", shape="same")
def binary_liar(a, b):
    return (a + b)[:1]


def stop_processes(procs) -> None:
    """Each process in turn, the workers first and each gone before the next is asked:
    a worker told to stop while its scheduler closes can hang in its own close
    (distributed's rpc close cancelled) until killed."""
    for p in procs[::-1]:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


class ScatterSpy:
    """``with ScatterSpy(client) as sent:`` — the bytes each ``client.scatter`` call of
    the block sends (a list, one entry per call); the client's own method after."""

    def __init__(self, client):
        self.client, self.sent = client, []

    def __enter__(self) -> list:
        scatter = self.client.scatter

        def spy(data, *a, **k):
            self.sent.append(sum(v.nbytes for v in data.values()))
            return scatter(data, *a, **k)

        self.client.scatter = spy
        return self.sent

    def __exit__(self, *exc) -> None:
        del self.client.scatter


def refetched(client, rf, before) -> bool:
    """Whether, during ``rf``'s run, a worker fetched an input chunk that it held when
    the run began (``before``: ``{key: holders}``): the memory manager dropped that copy
    meanwhile, and a task there read it."""
    since, until = rf._started, rf._finished + 0.5
    held = {k: set(ws) for k, ws in before.items()}

    def fetched(dask_worker, held=held, since=since, until=until):
        return [(e["who"], k) for e in dask_worker.transfer_outgoing_log
                if since <= e.get("middle", e["start"]) <= until for k in e["keys"] if k in held]

    return any(who in held[k] for moves in client.run(fetched).values() for who, k in moves)


def settle(client, arrays, limit: float = 5.0) -> dict | None:
    """Have Dask's memory manager drop the copies of the inputs that an earlier plan (or
    the ``compute`` of the expected result) fetched — one cycle now (``client.amm.run_once``)
    rather than waiting for its next (every 2 s) — and wait up to ``limit`` seconds for
    the scheduler to see one holder per chunk: ``{key: [holder]}``, or None if it does
    not.  (A plan reads each chunk from one holder; a planned transfer to a worker that
    holds a second copy does not happen, so such a run moves less than its plan
    predicts: tra_dask's model places a chunk on one site.  ``client.who_has`` takes
    futures — given plain keys it answers ``{}`` — so the scheduler is asked here.)"""
    import time

    from distributed import futures_of

    from tra_dask.runtime.cluster import _who_has

    keys = [f.key for f in futures_of(arrays)]
    deadline = time.monotonic() + limit
    while True:
        client.amm.run_once()
        who = _who_has(client, keys)
        if len(who) == len(keys) and all(len(w) == 1 for w in who.values()):
            return who
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)
