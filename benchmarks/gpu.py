"""The GPU check: tra_dask on GPU workers next to cupy alone and dask.array over cupy
chunks, in one run.

Run on a machine with a CUDA GPU and cupy, from a copy of the working tree, with no
network: where ``distributed`` is missing it installs the wheels in ``--wheels``
(downloaded beforehand: see ``benchmarks/README.md``) into a temporary folder and
starts again with it on the path.  Then it runs the GPU tests (``tests/test_gpu.py``),
and for 1 and 2 workers sharing the GPU (a LocalCluster, one thread each), calibrated
by ``td.calibrate``:

* 8192³ float32 and float64 matmul over dask arrays of cupy chunks persisted on the
  workers: cupy alone (one process, no Dask), dask.array, tra_dask (its chosen plan;
  predicted and measured seconds);
* the FFNN SGD step and nearest neighbour at sizes that fit, the same numpy-style code
  for all three;
* ``x.compute()`` of ``td.einsum`` over in-process cupy arrays (the first call sends
  them to the workers; later calls find them there) against cupy alone plus one round
  trip of the result through host memory.

Each timing synchronises the device on every worker before the clock stops (cupy's
kernels return before they finish).  ``--xp numpy --n 512`` runs the same code on
numpy here (a smoke test of the script, not a GPU result).  The table goes to stdout
and, with ``--out DIR``, to ``DIR/gpu.md``.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = "/tmp/tra-dask-gpu-site"


def _bootstrap(wheels: str) -> None:
    """Put the repository and, where dask is missing, the carried wheels on the path
    (for this process and the worker processes it spawns); start again if it changed."""
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    want = list(path)
    try:
        import distributed  # noqa: F401
    except ImportError:
        found = sorted(glob.glob(os.path.join(wheels, "*.whl")))
        if not found:
            sys.exit(f"gpu.py: dask/distributed are not installed and {wheels!r} holds no wheels")
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                               "--no-compile", "--no-cache-dir", "--upgrade", "--target", SITE, *found])
        want = [SITE] + want
    if REPO not in want:
        want = [REPO] + want
    if want != path:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(want), PYTHONUNBUFFERED="1")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheels", default=os.path.join(REPO, ".whl"))
    p.add_argument("--xp", default="cupy", choices=["cupy", "numpy"])
    p.add_argument("--n", type=int, default=8192, help="matmul size n (n x n x n)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-tests", dest="tests", action="store_false")
    p.add_argument("--out", default=os.environ.get("OUT"))
    return p.parse_args()


# -- the workloads: one numpy-style code for cupy, dask.array and td.Array ------------------


def ffnn_step(X, Y, W1, W2, lr=0.1):
    import numpy as np

    Z1 = X @ W1
    A1 = np.maximum(Z1, 0)
    L = A1 @ W2
    E = np.exp(L - L.max(axis=1, keepdims=True))
    P = E / E.sum(axis=1, keepdims=True)
    dZ2 = (P - Y) * (1.0 / X.shape[0])
    dW2 = A1.T @ dZ2
    dZ1 = (dZ2 @ W2.T) * (Z1 > 0)
    dW1 = X.T @ dZ1
    return W1 - dW1 * lr, W2 - dW2 * lr


def nearest(X, xq, A):
    diff = X - xq
    return ((diff @ A) * diff).sum(axis=1).argmin()


# -- timing ------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        import numpy as np

        self.args = args
        self.np = np
        if args.xp == "cupy":
            import cupy

            self.xp = cupy
            self.sync_here = lambda: cupy.cuda.runtime.deviceSynchronize()
        else:
            self.xp = np
            self.sync_here = lambda: None
        self.rows: list = []
        self.lines: list = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)
        self.write()

    def write(self) -> None:
        if self.args.out:
            os.makedirs(self.args.out, exist_ok=True)
            with open(os.path.join(self.args.out, "gpu.md"), "w") as f:
                f.write("\n".join(self.lines) + "\n")

    def sync_workers(self, client) -> None:
        if self.args.xp == "cupy":
            client.run(_device_sync)

    def timed(self, fn, client=None, repeat=None):
        """Seconds of ``fn()`` with the device synchronised before the clock stops:
        one untimed run, then the median of ``repeat``."""
        out = []
        for i in range((repeat or self.args.repeat) + 1):
            self.sync_here()
            if client is not None:
                self.sync_workers(client)
            t0 = time.perf_counter()
            fn(i)
            self.sync_here()
            if client is not None:
                self.sync_workers(client)
            if i:
                out.append(time.perf_counter() - t0)
        return statistics.median(out)


def _device_sync():
    try:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
    except ImportError:
        pass


def _random_block(block, module):
    """A block of uniform numbers of ``block``'s shape and dtype, made where it runs."""
    import importlib

    xp = importlib.import_module(module)
    return xp.random.default_rng().random(block.shape, dtype=block.dtype)


def _fresh(x, i):
    """A dask array with a fresh name over the same blocks (dask would find the last
    run's result under the old one)."""
    return x.map_blocks(lambda z: z, name=f"fresh-{i}-{time.monotonic_ns()}", dtype=x.dtype, meta=x._meta)


def run_cluster(b: Bench, workers: int) -> None:
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import tra_dask as td
    from tra_dask.runtime import spawn_config, worker_config

    xp, np = b.xp, b.np
    config = worker_config(64e9 / workers)
    with spawn_config(config), dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0", memory_limit=f"{int(60 / workers)}GiB")
    client = Client(cluster)  # the default client: dask.array's calls and distributed.wait use it
    try:
        t0 = time.perf_counter()
        spec = td.calibrate(client)
        b.say(f"\n### {workers} worker(s) on the one GPU\n\ncalibrated in {time.perf_counter() - t0:.1f} s: "
              f"`{spec!r}`\n")
        td.set_cluster_spec(client, spec)
        b.say("| case | cupy alone | dask.array | tra_dask | tra_dask / dask.array | tra_dask predicted "
              "| predicted / measured | tra_dask plan |")
        b.say("|---|---|---|---|---|---|---|---|")
        rng = xp.random.default_rng(0)

        def persisted(shape, dtype, chunks):
            """The same kind of data twice: here (for the library alone) and as a dask
            array whose blocks are made on the workers (not sent through the graph)."""
            arr = rng.random(shape, dtype=dtype)
            meta = xp.empty((0,) * len(shape), dtype=dtype)
            d = da.zeros(shape, chunks=chunks, dtype=dtype).map_blocks(_random_block, b.args.xp, dtype=dtype,
                                                                       meta=meta)
            d = client.persist(d)
            wait(d)
            return arr, d

        def case(name, local_fn, dask_fn, tra_expr_fn, inputs):
            try:
                local = b.timed(lambda i: local_fn(*[a for a, _ in inputs]))
                dsk = b.timed(lambda i: wait(client.persist(list(dask_fn(*[_fresh(d, i) for _, d in inputs])))),
                              client)
                exprs = tra_expr_fn(*[d for _, d in inputs])
                plan = td.submit(exprs, client=client)
                (plan[0] if isinstance(plan, tuple) else plan).wait()
                predicted = (plan[0] if isinstance(plan, tuple) else plan).plan.cost.seconds

                def tra(i):
                    out = td.submit(tra_expr_fn(*[d for _, d in inputs]), client=client)
                    for o in (out if isinstance(out, tuple) else (out,)):
                        o.wait()

                tra_t = b.timed(tra, client)
                p = (plan[0] if isinstance(plan, tuple) else plan).plan
                kinds = Counter(s.split(" (")[0] for s in p.strategies())
                b.say(f"| {name} | {local:.4f} s | {dsk:.4f} s | {tra_t:.4f} s | {tra_t / dsk:.2f} | "
                      f"{predicted:.4f} s | {predicted / tra_t:.2f} | "
                      f"{', '.join(f'{k} x{v}' if v > 1 else k for k, v in kinds.items()) or '-'}; "
                      f"{p.cost.bytes_moved / 2**20:.0f} MiB moved, {'device' if p.on_device else 'HOST'} model |")
            except Exception as e:  # one case failing must not lose the others' rows
                b.say(f"| {name} | failed: {type(e).__name__}: {str(e)[:200]} | | | | | | |")
                traceback.print_exc()

        n = b.args.n
        for dtype in ("float32", "float64"):
            ins = [persisted((n, n), dtype, n // 2), persisted((n, n), dtype, n // 2)]
            case(f"matmul {n}³ {dtype}", lambda a, c: a @ c, lambda a, c: [a @ c],
                 lambda a, c: td.einsum("ij,jk->ik", a, c), ins)
            del ins
        # FFNN step: batch x features -> hidden -> classes, float32
        bsz, feat, hid, cls = n * 2, n, n // 2, n // 8
        ins = [persisted((bsz, feat), "float32", (bsz // 2, feat)), persisted((bsz, cls), "float32", (bsz // 2, cls)),
               persisted((feat, hid), "float32", (feat, hid)), persisted((hid, cls), "float32", (hid, cls))]
        case(f"FFNN step {bsz}x{feat}x{hid}x{cls} float32", lambda *a: ffnn_step(*a), lambda *a: list(ffnn_step(*a)),
             lambda *a: ffnn_step(*[td.asarray(v) for v in a]), ins)
        del ins
        # nearest neighbour: N points of D dims under a D x D metric, float32
        N, D = n * 8, n // 2
        ins = [persisted((N, D), "float32", (N // 4, D)), persisted((D,), "float32", (D,)),
               persisted((D, D), "float32", (D, D))]
        case(f"nearest neighbour {N}x{D} float32", nearest, lambda *a: [nearest(*a)],
             lambda *a: nearest(*[td.asarray(v) for v in a]), ins)
        del ins
        in_process(b, client, n)
    finally:
        client.close()
        cluster.close()


def in_process(b: Bench, client, n: int) -> None:
    """``x.compute()`` over in-process arrays: the first call sends them, later ones
    find them on the workers; against the local product plus one round trip of the
    result through host memory (what a cupy user pays to get a result back from
    another process)."""
    import tra_dask as td

    xp = b.xp
    rng = xp.random.default_rng(1)
    a = rng.random((n, n), dtype="float32")
    c = rng.random((n, n), dtype="float32")
    try:
        local = b.timed(lambda i: a @ c)

        def round_trip(i):
            r = a @ c
            h = r.get() if hasattr(r, "get") else r.copy()
            xp.asarray(h)

        trip = b.timed(round_trip)
        t0 = time.perf_counter()
        out = td.einsum("ij,jk->ik", a, c).compute(client=client)
        b.sync_here()
        first = time.perf_counter() - t0
        again = b.timed(lambda i: td.einsum("ij,jk->ik", a, c).compute(client=client), client)
        from tra_dask.runtime.device import LAST

        path = dict(LAST)
        held = []
        run = b.timed(lambda i: held.append(td.submit(td.einsum("ij,jk->ik", a, c), client=client).wait()), client)
        gather = b.timed(lambda i: held[i].assembled())
        err = float(abs(out - a @ c).max())
        b.say(f"\n`x.compute()` on in-process {n}² float32 inputs: first call {first:.3f} s (sends them), "
              f"then {again:.3f} s; cupy alone {local:.4f} s, + one round trip of the result through the host "
              f"{trip:.4f} s: **{again / trip:.2f}x** that (target <= 2x); result type "
              f"{type(out).__module__.split('.')[0]}, max error {err:.2e}; of which submit + run {run:.3f} s, "
              f"gather + assemble {gather:.3f} s (gathered via {path['path']}{': ' + path['why'] if path['why'] else ''})")
    except Exception as e:
        b.say(f"\n`x.compute()` on in-process inputs failed: {type(e).__name__}: {e}")
        traceback.print_exc()


def machine(b: Bench) -> str:
    import dask
    import distributed

    dev = "no GPU (numpy smoke test)"
    if b.args.xp == "cupy":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        dev = (f"{props['name'].decode()} ({cupy.cuda.Device(0).mem_info[1] / 2**30:.0f} GiB), cupy "
               f"{cupy.__version__}")
    return (f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()} ({os.cpu_count()} cores), {dev}, "
            f"python {platform.python_version()}, numpy {b.np.__version__}, dask/distributed "
            f"{dask.__version__}/{distributed.__version__}")


def main() -> None:
    args = _args()
    _bootstrap(args.wheels)
    b = Bench(args)
    b.say(f"## GPU check ({machine(b)})")
    if args.tests:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "--timeout", "150",
                            "tests/test_gpu.py"], cwd=REPO, capture_output=True, text=True)
        print(r.stdout[-6000:], r.stderr[-2000:], flush=True)
        if args.out:
            with open(os.path.join(args.out, "gpu-tests.txt"), "w") as f:
                f.write(r.stdout + "\n" + r.stderr)
        last = [ln for ln in r.stdout.splitlines() if ln.strip()][-1:] or ["(no output)"]
        b.say(f"\nGPU tests (tests/test_gpu.py): {last[0].strip('= ')} in {time.perf_counter() - t0:.0f} s")
    for w in args.workers:
        run_cluster(b, w)
    b.say(f"\nfinished {datetime.datetime.now():%H:%M:%S}")


if __name__ == "__main__":
    main()
