"""Planning from many threads at once (no cluster): eight different expressions — seven
TRA expressions over keys only and one array expression whose chunking is chosen with
its plan — each planned by its own thread, no error, and every plan equal to the one
planned alone: the optimizer's module caches (the type memo's LRU, the front-end's
chunk choices) are shared by all threads.
``TRA_DASK_THREAD_ROUNDS`` plans each expression that many times per thread (default 4;
the planning-context issue asks for 200)."""

import os
import threading

import numpy as np
import pytest

import tra_dask as td
from tra_dask.programs import ffnn_forward, matmul


def _never(key):  # keys only: planning reads the types
    raise AssertionError("planning made a chunk")


def _src(shape, chunks, name):
    return td.from_function(_never, shape, chunks, "float64", name=name)


def _expressions():
    A, B = _src((600, 400), (100, 100), "A"), _src((400, 300), (100, 100), "B")
    X, W = _src((800, 64), (200, 64), "X"), _src((64, 64), (64, 64), "W")
    W2 = _src((64, 16), (64, 16), "W2")
    x = _src((200, 64), (100, 64), "x")
    return [
        (matmul(A, B), 2),
        (matmul(A, td.transform(B, "exp")), 3),
        (matmul(td.transform(A, "relu"), B), 4),
        (td.aggregate(A, (0,), "add"), 2),
        (matmul(X, W), 4),
        (ffnn_forward(x, W, W2, softmax=False), 2),
        (td.aggregate(td.transform(matmul(x, W), "exp"), (1,), "add"), 3),
        (matmul(matmul(A, B), td.transform(_src((300, 200), (100, 100), "C"), "exp")), 2),
    ]


def _fingerprint(plan) -> tuple:
    c = plan.cost
    return (repr(plan.outputs), c.floats_moved, c.tasks, round(float(c.seconds), 12),
            tuple(np.asarray(c.peak_bytes_per_site).tolist()))


def _plans():
    """Eight ways to plan, one per expression: ``() -> Plan``."""
    out = [lambda e=e, s=s: td.optimize(e, sites=s) for e, s in _expressions()[:7]]
    a = td.asarray(np.arange(96.0).reshape(12, 8))
    out.append(lambda x=(a @ a.T).sum(axis=0): x.to_relation(sites=3)[1])  # chunking chosen with the plan
    return out


@pytest.mark.slow
def test_eight_threads_plan_eight_expressions_as_planned_alone():
    plans = _plans()
    assert len(plans) == 8
    alone = [_fingerprint(make()) for make in plans]
    rounds, errors, wrong = int(os.environ.get("TRA_DASK_THREAD_ROUNDS", "4")), [], []
    barrier = threading.Barrier(len(plans))

    def worker(i):
        barrier.wait()
        for _ in range(rounds):
            try:
                got = _fingerprint(plans[i]())
            except Exception as ex:  # noqa: BLE001 - every failure is reported
                errors.append(f"{i}: {type(ex).__name__}: {ex}")
                return
            if got != alone[i]:
                wrong.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert not wrong, f"plans differ from the sequential ones for expressions {sorted(set(wrong))}"
