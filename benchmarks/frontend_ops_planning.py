"""Planning time of the array front-end's operations beyond einsum (issue 41), the
re-cuts among them.

For one expression per operation over a 240x160 float64 array, planned in this
process for ``--sites`` sites of the default cluster description (the chunking
chosen with the plan, time objective), prints: the chunkings the chooser planned
(counted with a stand-in cost, so the count is the search's own), the seconds of the
``chunking`` stage (which includes the optimizer's search under every candidate) and
the CPU seconds of this process for the whole planning (steadier than wall time on a
shared machine), and the same for the baseline ``x + x``.  A new operation must not add a chunking
search of its own: its count is at most the baseline's.

    python benchmarks/frontend_ops_planning.py [--sites 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tra_dask as td
from tra_dask.frontend import run
from tra_dask.frontend.chunking import AxisClasses, choose


def searched(expr, sites: int) -> tuple[int, int]:
    """(chunkings the chooser plans, axis classes it searches) for ``expr``."""
    cl = AxisClasses([expr._node])
    calls = []
    choose(cl, sites, lambda blocks: (calls.append(tuple(blocks)), (None, float(sum(blocks)) + 1.0))[1])
    free = sum(len(cl.candidates(ci, sites)) > 1 for ci in range(len(cl.classes)))
    return len(set(calls)), free


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sites", type=int, default=4)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    x = td.from_array(rng.standard_normal((240, 160)))
    exprs = {
        "x + x (baseline)": x + x,
        "prod(axis=1)": x.prod(axis=1),
        "std(axis=0)": x.std(axis=0),
        "var(axis=None)": x.var(),
        "any(axis=0)": (x > 0).any(axis=0),
        "all(axis=1)": (x > 0).all(axis=1),
        "x == x": x == x,
        "sin": np.sin(x),
        "astype(float32)": x.astype(np.float32),
        "where(x > 0, x, 0)": td.where(x > 0, x, 0.0),
        "x.sum(1)[:, None] * x": x.sum(1)[:, None] * x,
        "reshape(240, 16, 10)": x.reshape(240, 16, 10),
        "concatenate([x, x])": td.concatenate([x, x]),
        "stack([x, x])": td.stack([x, x]),
        "softmax(axis=-1)": td.softmax(x),
        "cov": td.cov(x),
        "cumsum(axis=0)": x.cumsum(axis=0),
        "x[3:227] (re-cut)": x[3:227],
        "x[::-1, ::3] (re-cut)": x[::-1, ::3],
        "x[[5, 0, 239, 5]] (take)": x[[5, 0, 239, 5]],
        "x[:, x0 > 0] (mask)": x[:, rng.standard_normal(160) > 0],
        "flip": np.flip(x),
        "roll(7, axis=0)": np.roll(x, 7, axis=0),
        "repeat(2, axis=1)": np.repeat(x, 2, axis=1),
        "tile((2, 1))": np.tile(x, (2, 1)),
        "tril": np.tril(x),
        "x[3:227] @ x[3:227].T": x[3:227] @ x[3:227].T,
    }
    td.to_numpy(x + 1)  # warm up imports
    print(f"{'expression':<24} {'chunkings':>9} {'searched classes':>16} {'chunking stage (s)':>19} {'CPU (s)':>8}")
    for name, e in exprs.items():
        n, free = searched(e, args.sites)
        run._CHOICES.clear()  # (no remembered choice)
        t0, c0 = time.perf_counter(), time.process_time()
        _, plan = e.to_relation(sites=args.sites)
        took, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"{name:<24} {n:>9} {free:>16} {plan.stage('chunking').seconds:>12.2f} ({took:.2f} total) {cpu:>8.2f}")


if __name__ == "__main__":
    main()
