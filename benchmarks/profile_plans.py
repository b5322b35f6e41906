"""Where the time goes: a per-plan profile of tra_dask and dask.array on the benchmark
workloads, numpy's wall time next to them.

For every workload (the matmul shapes, the FFNN steps and the nearest-neighbour data
sets of matmul.py, ffnn.py and nearest_neighbor.py, at their sizes) on a
LocalCluster(--sites workers x 1 thread): fresh inputs persisted where Dask puts them
(untimed), and every run of each system on a copy of them made in the same places,
the systems alternating (so bytes moved compare on one placement); for
tra_dask ``td.plan_for`` (timed: "plan") then ``td.submit`` of that plan and a wait
(timed: "wall"); for dask.array ``client.persist`` of the natural code
and a wait.  The run with the least wall of --repeat is reported, broken down with
distributed's fine performance metrics (``Worker.digests_total``, the difference
across the run) and its task stream, in seconds per worker (sum over workers / workers):

* kernel: time in task functions (``execute`` thread-cpu + thread-noncpu);
* serde: (de)serialisation for transfers and task arguments (``get-data`` serialize,
  ``gather-dep`` deserialize, ``execute`` deserialize, (de)compression);
* network: a receiving worker waiting on the wire (``gather-dep`` network) — overlaps
  with the same worker's kernels or its idle time;
* executor: the worker's own per-task bookkeeping (``execute`` executor + other);
* idle: wall - kernel - executor: the worker thread has nothing to run (waiting for
  a transfer, for the scheduler, or for the other worker);
* outside: wall - (last task end - first task start) from the task stream: submit,
  graph transfer to the scheduler, the first task's scheduling, the client learning
  of the results.

With ``--placement tra_dask`` tra_dask's inputs are where its own plan puts them (the
same data as ``td.from_numpy`` sources, sent once before timing, as a training loop's
arrays are); dask.array's stay where Dask persisted them.

    python benchmarks/profile_plans.py --label after [--repeat 2] [--sites 2] [--only matmul ffnn nn]
        [--placement dask|tra_dask] [--quick]

Run it against another commit for a "before" table: ``git worktree add /tmp/x <commit>``,
then ``PYTHONPATH=/tmp/x python benchmarks/profile_plans.py --label before`` (the workers
inherit PYTHONPATH, so they run that commit's tra_dask too).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import subprocess
import sys
import time
from collections import defaultdict

import dask.array as da
import numpy as np
from distributed import wait

import tra_dask as td
import ffnn
import matmul
import nearest_neighbor
from _harness import machine_line, start_cluster, twins
from _report import write_section
from tra_dask.optimizer.time import plan_seconds
from tra_dask.programs import ffnn_sgd_step, nearest_neighbor as nn_program, matmul as matmul_program


def _workloads(args):
    """(name, inputs(seed) -> persisted dask arrays, tra(arrays) -> expression, natural(xp, *arrays))."""
    out = []
    dtype = args.dtype
    if "matmul" in args.only:
        for shape, dims in matmul.SHAPES.items():
            I, K, J = (max(1, int(d * args.scale)) for d in dims)
            bi, bk, bj = matmul.BLOCKS[shape]

            def inputs(seed, I=I, K=K, J=J, bi=bi, bk=bk, bj=bj):
                rng = da.random.default_rng(seed)
                return [rng.random((I, K), chunks=(-(-I // bi), -(-K // bk)), dtype=dtype),
                        rng.random((K, J), chunks=(-(-K // bk), -(-J // bj)), dtype=dtype)]

            out.append((f"matmul {shape} {I}x{K}x{J}", inputs,
                        lambda rel: matmul_program(*rel), lambda xp, a, b: a @ b, ("A", "B")))
    if "ffnn" in args.only:
        for case, (dims, blocks) in ffnn.CASES.items():
            N, D, H, L = (max(2, int(d * args.scale)) for d in dims)

            def inputs(seed, dims=(N, D, H, L), blocks=blocks):
                return ffnn.make_inputs(seed, dims, blocks, dtype)

            out.append((f"ffnn {case} N={N} D={D} H={H} L={L}", inputs,
                        lambda rel: ffnn_sgd_step(*rel, ffnn.LR),
                        lambda xp, X, Y, W1, W2, N=N: ffnn.step(xp, X, Y, W1, W2, N), ("X", "Y", "W1", "W2")))
    if "nn" in args.only:
        for case, (dims, blocks) in nearest_neighbor.CASES.items():
            N, D = (max(4, int(d * args.scale)) for d in dims)

            def inputs(seed, dims=(N, D), blocks=blocks):
                return nearest_neighbor.make_inputs(seed, dims, blocks, dtype)

            out.append((f"nn {case} N={N} D={D}", inputs, lambda rel: nn_program(*rel),
                        lambda xp, q, X, M: (lambda v, i: da.stack([v, i]) if xp is da else (v, i))(
                            *nearest_neighbor.nn(xp, q, X, M)), ("xq", "X", "A")))
    return out


def _digests(client) -> dict:
    return client.run(lambda dask_worker: {k: v for k, v in dask_worker.digests_total.items() if isinstance(k, tuple)})


def _breakdown(client, before: dict, after: dict, t0: float, t1: float) -> dict:
    """Seconds per worker in each category over one run (see the module doc)."""
    cat = defaultdict(float)
    workers = list(after)
    for w in workers:
        for k, v in after[w].items():
            if k[-1] != "seconds":
                continue
            d = v - before.get(w, {}).get(k, 0.0)
            if k[0] == "execute":
                activity = k[-2]
                if activity in ("thread-cpu", "thread-noncpu"):
                    cat["kernel"] += d
                elif activity in ("deserialize", "decompress"):
                    cat["serde"] += d
                else:
                    cat["executor"] += d
            elif k[0] == "gather-dep":
                cat["network" if k[1] == "network" else "serde" if k[1] in ("deserialize", "decompress") else "other"] += d
            elif k[0] == "get-data":
                if k[1] in ("serialize", "compress"):
                    cat["serde"] += d
    n = max(1, len(workers))
    out = {k: v / n for k, v in cat.items()}
    wall = t1 - t0
    out["idle"] = max(0.0, wall - out.get("kernel", 0.0) - out.get("executor", 0.0))
    stream = client.get_task_stream(start=t0 - 0.01, stop=t1 + 0.5)
    starts = [ss["start"] for r in stream for ss in r["startstops"] if ss["action"] == "compute"]
    stops = [ss["stop"] for r in stream for ss in r["startstops"] if ss["action"] == "compute"]
    out["outside"] = max(0.0, wall - (max(stops) - min(starts))) if starts else wall
    out["tasks"] = len(starts)  # tasks that ran (fused ones ran inside their readers)
    out["wall"] = wall
    return out


def _moved(client, t0, t1) -> int:
    from _harness import worker_bytes

    return worker_bytes(client, t0 - 0.01, t1 + 0.5)


def _run_tra(client, arrays, tra, names):
    """One tra_dask run over persisted ``arrays``: plan (timed apart), submit, wait;
    the plan's predicted seconds on this cluster as ``td.calibrate`` measured it."""
    rel = [td.from_dask_array(x, client=client, name=nm) for x, nm in zip(arrays, names)]
    return _run_expr(client, tra(rel))


def _run_expr(client, expr):
    """Plan ``expr`` (timed apart), submit it, wait: the breakdown of one run."""
    p0 = time.perf_counter()
    plan = td.plan_for(expr, client)
    planning = time.perf_counter() - p0
    before = _digests(client)
    t0 = time.time()
    rf = td.submit(plan, client=client)
    for one in rf if isinstance(rf, tuple) else (rf,):
        one.wait()
    t1 = time.time()
    after = _digests(client)
    r = _breakdown(client, before, after, t0, t1)
    first = rf[0] if isinstance(rf, tuple) else rf
    r.update(plan=planning, moved=first.transfers(), predicted_moved=plan.cost.bytes_moved,
             predicted=plan_seconds(plan.cost, td.cluster_spec(client))[0])
    return r


def _run_dask(client, arrays, natural):
    """One dask.array run of the natural code over persisted ``arrays``."""
    out = natural(da, *arrays)
    xs = list(out) if isinstance(out, (tuple, list)) else [out]
    before = _digests(client)
    t0 = time.time()
    ys = client.persist(xs)
    wait(ys)
    t1 = time.time()
    after = _digests(client)
    r = _breakdown(client, before, after, t0, t1)
    r["moved"] = _moved(client, t0, t1)
    del ys
    return r


def _profile(client, inputs, tra, natural, names, seeds, repeat):
    """Best run (least wall) of each system over ``repeat`` runs.  The inputs are
    persisted once, where Dask puts them; every run is on a copy of them in the same
    places (:func:`_harness.twins`), the systems alternating, so bytes moved compare
    on one placement and no run profits from copies an earlier one fetched."""
    best = {}
    base = client.persist(inputs(next(seeds)))
    wait(base)
    runs = [("tra_dask", lambda a: _run_tra(client, a, tra, names)),
            ("dask.array", lambda a: _run_dask(client, a, natural))]
    for i in range(repeat):
        for system, run in runs if i % 2 == 0 else runs[::-1]:
            arrays = twins(client, base)
            r = run(arrays)
            del arrays  # released when unreferenced (a cancel can take shared keys)
            if system not in best or r["wall"] < best[system]["wall"]:
                best[system] = r
    return best


def _profile_placed(client, inputs, tra, natural, names, seeds, repeat):
    """As :func:`_profile`, but tra_dask places its inputs: the same data, gathered
    into this process, enters as ``td.from_numpy`` sources in the same chunks; a first
    submission (untimed) sends every chunk to the worker its plan chose, and the timed
    runs — a user's next steps on the same arrays — find them there (tra_dask sends a
    chunk of a live array once per worker, and drops the copies earlier plans moved,
    so every run moves what its plan says).  dask.array runs on twins of the inputs
    where Dask persisted them."""
    best = {}
    base = client.persist(inputs(next(seeds)))
    wait(base)
    local = [client.compute(x).result() for x in base]
    expr = tra([td.from_numpy(a, x.chunksize, name=nm) for a, x, nm in zip(local, base, names)])
    warm = td.submit(expr, client=client)
    for one in warm if isinstance(warm, tuple) else (warm,):
        one.wait()
    del warm
    runs = [("tra_dask", lambda: _run_expr(client, expr)),
            ("dask.array", lambda: _run_dask(client, twins(client, base), natural))]
    for i in range(repeat):
        for system, run in runs if i % 2 == 0 else runs[::-1]:
            r = run()
            if system not in best or r["wall"] < best[system]["wall"]:
                best[system] = r
    return best


def _numpy(client, inputs, natural, seeds, repeat):
    arrays = [client.compute(x).result() for x in client.persist(inputs(next(seeds)))]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        natural(np, *arrays)
        best = min(best, time.perf_counter() - t0)
    return best


def _commit() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(td.__file__)))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except Exception:
        return "unknown commit"


COLS = ("wall", "plan", "kernel", "serde", "network", "executor", "idle", "outside")


def _error_line(errors) -> str:
    """Predicted vs measured seconds of the tra_dask rows: the distribution."""
    if not errors:
        return ""
    e = np.sort(np.asarray(errors) * 100)
    within = int((np.abs(e) <= 30).sum())
    return (f"Predicted / measured seconds - 1 over the {len(e)} tra_dask rows: min {e[0]:+.0f}%, median "
            f"{np.median(e):+.0f}%, max {e[-1]:+.0f}%; {within} of {len(e)} within ±30%.")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", default="after")
    p.add_argument("--sites", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--only", nargs="+", default=["matmul", "ffnn", "nn"], choices=["matmul", "ffnn", "nn"])
    p.add_argument("--placement", choices=["dask", "tra_dask"], default="dask",
                   help="where tra_dask's inputs are: where Dask persisted them (both systems the same), or "
                        "where tra_dask's plan puts them (dask.array's still where Dask persisted them)")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat, nothing written")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    if args.quick:
        args.scale, args.repeat, args.write = 0.05, 1, False
    client = start_cluster(args.sites)
    client.get_task_stream()  # starts the scheduler's task-stream plugin (it records from then on)
    seeds = itertools.count()
    t0 = time.perf_counter()
    spec = td.cluster_spec(client)  # calibrates this cluster once (cached): the predicted seconds below
    print(f"calibrated in {time.perf_counter() - t0:.2f} s: {spec!r}", flush=True)
    lines = ["| workload | system | " + " | ".join(f"{c} (s)" for c in COLS) + " | predicted (s) | tasks | MiB moved "
             "| MiB predicted | / numpy | / dask.array |",
             "|---|---|" + "---:|" * (len(COLS) + 6)]
    errors = []
    try:
        for name, inputs, tra, natural, names in _workloads(args):
            t_np = _numpy(client, inputs, natural, seeds, args.repeat)
            profile = _profile_placed if args.placement == "tra_dask" else _profile
            best = profile(client, inputs, tra, natural, names, seeds, args.repeat)
            t_da = best["dask.array"]["wall"]
            for system, r in best.items():
                cells = [f"{r[c]:.3f}" if c in r else "-" for c in COLS]
                pred = f"{r['predicted']:.3f}" if "predicted" in r else "-"
                pmib = f"{r['predicted_moved'] / 2**20:.1f}" if "predicted_moved" in r else "-"
                line = (f"| {name} | {system} | " + " | ".join(cells)
                        + f" | {pred} | {r['tasks']} | {r['moved'] / 2**20:.1f} | {pmib} | {r['wall'] / t_np:.2f} "
                          f"| {r['wall'] / t_da:.2f} |")
                print(line, flush=True)
                lines.append(line)
                if "predicted" in r:
                    errors.append(r["predicted"] / r["wall"] - 1)
            line = f"| {name} | numpy | {t_np:.3f} |" + " - |" * (len(COLS) - 1) + f" - | - | - | - | 1.00 | {t_np / t_da:.2f} |"
            print(line, flush=True)
            lines.append(line)
    finally:
        client.close()
    print(_error_line(errors))
    if args.write:
        write_section(f"profile: {args.label}", [
            f"`python benchmarks/profile_plans.py --label {shlex.quote(args.label)} --repeat {args.repeat} --dtype {args.dtype}"
            f"{' --placement tra_dask' if args.placement == 'tra_dask' else ''}` at "
            f"tra_dask {_commit()} — {machine_line(args)}. Seconds per worker; the run with the least wall of "
            f"{args.repeat} (categories: the script's doc); predicted: the plan's seconds under the time model on "
            f"this cluster as `td.calibrate` measured it ({spec!r}).", "", *lines, "", _error_line(errors)])


if __name__ == "__main__":
    sys.exit(main())
