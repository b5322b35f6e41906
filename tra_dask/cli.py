"""The ``tra-dask`` command.

``tra-dask run matmul --shape general --scale 0.05`` builds the paper's matrix
multiply (§6.1) at ``scale`` times the paper's sizes, plans it, prints the plan with
its predicted cost, runs it on an embedded Dask cluster (or on ``--scheduler
ADDRESS``) with a progress bar, checks sampled output blocks against numpy, and
prints the wall time, predicted vs measured bytes moved between workers, and the
dashboard links (``--keep``: the embedded cluster stays up until Ctrl-C).  A
``--scheduler tls://…`` is reached with ``--tls-ca-file``, ``--tls-cert`` and
``--tls-key`` (the options ``dask scheduler`` and ``dask worker`` take).
``tra-dask explain matmul ...`` prints the plan and its predicted cost only: no
cluster is started.

Errors are one line on stderr (``tra-dask: error: ...``; ``--debug``: the
traceback); exit status 2 for a wrong command line or cluster, 1 for other errors.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import signal
import sys
import time
from pathlib import Path

import numpy as np

from . import __version__
from .optimizer import compile as compiled_plan, optimize as optimized_plan
from .programs import matmul, random_uniform
from .units import fmt_bytes as _fmt_bytes

# The paper's three matrix-multiply shapes (I, K, J), §6.1.
PAPER_SHAPES = {
    "general": (40_000, 40_000, 40_000),
    "common-large-dim": (10_000, 640_000, 10_000),
    "two-large-dims": (80_000, 10_000, 80_000),
}
CONNECT_TIMEOUT = 5.0  # seconds to reach a --scheduler and hear back from it
EMBEDDED_SITES = 2     # --sites default on the embedded cluster


class UsageError(Exception):
    """A wrong command line or cluster: reported in one line, exit status 2."""


# ---------------------------------------------------------------------------
# the workload and its plan


def matmul_workload(args):
    """``(A, B, C, (I, K, J))``: the paper's matrices for the workload options."""
    I, K, J = (max(1, round(d * args.scale)) for d in PAPER_SHAPES[args.shape])
    b = args.blocks
    A = random_uniform((I, K), (-(-I // b), -(-K // b)), seed=args.seed, dtype=args.dtype, name="A")
    B = random_uniform((K, J), (-(-K // b), -(-J // b)), seed=args.seed + 1, dtype=args.dtype, name="B")
    C = matmul(A, B)
    print(f"tra-dask {args.cmd} matmul --shape {args.shape} --scale {args.scale}: "
          f"A {I}x{K} @ B {K}x{J}, {args.dtype}, {b} blocks per dim")
    print(f"  expression: {C!r}")
    return A, B, C, (I, K, J)


def make_plan(args, C, client=None):
    """The plan for ``args.sites`` sites (optimized, or the paper's with --compiled), printed.
    With a ``client``, optimized for its cluster (calibrated on the first plan, cached);
    without, for the default :class:`~tra_dask.ClusterSpec`."""
    t0 = time.perf_counter()
    if args.compiled:
        plan = compiled_plan(C, sites=args.sites)
    elif client is not None:
        from .runtime.calibrate import cluster_spec
        from .runtime import plan_for

        spec = cluster_spec(client)  # timed apart from the search: the first plan on a cluster measures it
        print(f"  cluster spec ({time.perf_counter() - t0:.1f} s): {spec.source}")
        t0 = time.perf_counter()
        plan = plan_for(C, client, args.sites)
    else:
        plan = optimized_plan(C, sites=args.sites)
    how = "the paper's compiled plan (--compiled)" if args.compiled else (
        f"optimized in {time.perf_counter() - t0:.2f} s from {len(plan.alternatives) + 1} plans considered")
    print(f"  plan for {args.sites} sites: {how}")
    print("\n".join("    " + line for line in plan.explain().splitlines()))
    return plan


def explain_matmul(args) -> int:
    """``tra-dask explain matmul``: the plan and its predicted cost, nothing run."""
    args.sites = args.sites or EMBEDDED_SITES
    C = matmul_workload(args)[2]
    plan = make_plan(args, C)
    print(f"  predicted bytes moved between workers: {_fmt_bytes(plan.cost.bytes_moved)}")
    return 0


# ---------------------------------------------------------------------------
# the cluster


def security(args):
    """The ``distributed.Security`` for ``--scheduler``: the ``--tls-*`` files given
    (over Dask's ``distributed.comm.tls`` settings), TLS required; None without them."""
    given = {"tls_ca_file": args.tls_ca_file, "tls_client_cert": args.tls_cert, "tls_client_key": args.tls_key}
    if not any(given.values()):
        return None
    from distributed import Security

    for name, path in given.items():
        if path is not None and not Path(path).is_file():
            option = {"tls_ca_file": "--tls-ca-file", "tls_client_cert": "--tls-cert", "tls_client_key": "--tls-key"}[name]
            raise UsageError(f"{option} {path}: no such file")
    return Security(require_encryption=True, **{k: v for k, v in given.items() if v is not None})


async def _identity(address: str, sec=None) -> dict:
    """The scheduler's answer to ``identity``, over a connection of our own."""
    from distributed.comm import connect

    kw = sec.get_connection_args("client") if sec is not None else {}
    comm = await connect(address, timeout=CONNECT_TIMEOUT, **kw)
    try:
        await comm.write({"op": "identity", "n_workers": -1, "reply": True})
        return await comm.read()
    finally:
        comm.abort()


def scheduler_workers(address: str, sec=None) -> list[str]:
    """The workers of the Dask scheduler at ``address`` (``sec``: a
    ``distributed.Security`` for a ``tls://`` address), asked within CONNECT_TIMEOUT
    seconds (a ``Client`` may wait forever on something that is not a scheduler)."""
    if address.startswith("tls://") and (sec is None or not sec.tls_ca_file):
        raise UsageError(f"--scheduler {address} is TLS: give --tls-ca-file, --tls-cert and --tls-key "
                         f"(the CA that signed the scheduler's certificate, this client's certificate and key)")
    if sec is not None and not address.startswith("tls://"):
        raise UsageError(f"--tls-* options need a tls:// --scheduler address, not {address}")
    try:
        identity = asyncio.run(asyncio.wait_for(_identity(address, sec), CONNECT_TIMEOUT))
        return sorted(identity["workers"])
    except ValueError as e:  # a malformed address
        raise UsageError(f"--scheduler {address}: {e}") from e
    except (OSError, asyncio.TimeoutError) as e:
        root = e  # dask's "timed out trying to connect" is caused by, e.g., a refused connection
        while root.__cause__ is not None:
            root = root.__cause__
        why = getattr(root, "strerror", None) or str(root) or "no answer"
        raise UsageError(f"cannot reach a Dask scheduler at {address} in {CONNECT_TIMEOUT:g} s: {why}") from e
    except Exception as e:
        raise UsageError(f"{address} did not answer as a Dask scheduler does ({type(e).__name__})") from e


def connect(args):
    """``(client, description)``: a client of the ``--scheduler`` cluster (--sites
    defaults to all its workers; more sites than workers is an error at once) or of
    the embedded cluster (--sites workers, default EMBEDDED_SITES)."""
    from distributed import Client

    from .runtime import embedded_client

    if not args.scheduler:
        args.sites = args.sites or EMBEDDED_SITES
        # The worker processes inherit an ignored SIGINT: Ctrl-C (sent to the whole
        # process group) stops this process, which stops them, without their tracebacks.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return embedded_client(args.sites), "embedded LocalCluster on 127.0.0.1"
        finally:
            signal.signal(signal.SIGINT, previous)
    sec = security(args)
    n = len(scheduler_workers(args.scheduler, sec))
    if n == 0:
        raise UsageError(f"the Dask scheduler at {args.scheduler} has no workers")
    if args.sites is None:
        args.sites = n
    elif args.sites > n:
        raise UsageError(f"--sites {args.sites} but the Dask scheduler at {args.scheduler} has {n} worker(s); "
                         f"one site runs on one worker")
    client = Client(args.scheduler, timeout=f"{CONNECT_TIMEOUT:g}s", set_as_default=False, security=sec)
    return client, f"scheduler {args.scheduler}"


# ---------------------------------------------------------------------------
# run


PROGRESS_MARKS = (25, 50, 75, 100)  # percent done at which a log (not a terminal) gets a line


def progress_lines(total: int, completions, marks=PROGRESS_MARKS, clock=time.perf_counter):
    """The lines a log gets while ``total`` results complete: one per mark of
    ``marks`` (percent done) as the results of ``completions`` (an iterable yielding
    once per result done) cross it — a few lines, not a bar redrawn ten times a second.

    >>> list(progress_lines(8, range(8), clock=lambda: 0.0))  # doctest: +NORMALIZE_WHITESPACE
    ['  25% done (2/8 result chunks) after 0.0 s', '  50% done (4/8 result chunks) after 0.0 s',
     '  75% done (6/8 result chunks) after 0.0 s', '  100% done (8/8 result chunks) after 0.0 s']
    """
    t0 = clock()
    due = sorted({max(1, -(-total * m // 100)): m for m in marks}.items())  # results done -> mark
    done = 0
    for _ in completions:
        done += 1
        while due and done >= due[0][0]:
            yield f"  {due.pop(0)[1]}% done ({done}/{total} result chunks) after {clock() - t0:.1f} s"


def show_progress(futures: list, scheduler: str, out=None) -> None:
    """Progress while ``futures`` run: distributed's text bar on a terminal; where
    stdout is not one (a log, ``make demo > log``) the milestone lines of
    :func:`progress_lines` instead."""
    from distributed import as_completed, progress

    out = out or sys.stdout
    if out.isatty():
        progress(futures, scheduler=scheduler)
        print(file=out)
        return
    loop = futures[0].client.loop if futures else None  # (the command's client need not be the default)
    for line in progress_lines(len(futures), as_completed(futures, loop=loop)):
        print(line, file=out, flush=True)


def run_matmul(args) -> int:
    """``tra-dask run matmul``: plan, run, check against numpy, report."""
    from .runtime import submit, workers_info

    A, B, C, (I, K, J) = matmul_workload(args)
    chose = args.sites is None
    t0 = time.perf_counter()
    client, where = connect(args)
    try:
        print(f"  cluster: {where}, {len(workers_info(client))} workers, {args.sites} sites"
              f"{' (all its workers; --sites to choose)' if chose and args.scheduler else ''} "
              f"(ready in {time.perf_counter() - t0:.1f} s)")
        plan = make_plan(args, C, client)
        t0 = time.perf_counter()
        rf = submit(plan, client=client, sites=args.sites, name=f"tra-dask run matmul {args.shape}")
        if args.progress:
            show_progress(list(rf.values()), client.scheduler.address)
        rf.wait()
        wall = time.perf_counter() - t0
        print(f"  ran {rf.lowered.ntasks} pinned tasks in {wall:.2f} s ({2.0 * I * K * J / wall / 1e9:.1f} GFLOP/s)")
        predicted, measured = rf.plan.cost.bytes_moved, rf.transfers()
        print(f"  bytes moved between workers: predicted {_fmt_bytes(predicted)}, measured {_fmt_bytes(measured)}")
        ok = check_blocks(args, A, B, rf)
        print(f"  dashboard: {client.dashboard_link} (this plan: {rf.dashboard_link})")
        print(f"  machine: {platform.node()} {platform.machine()}, python {platform.python_version()}, "
              f"numpy {np.__version__}")
        if args.keep:
            keep_until_interrupted(client, rf)
    finally:
        if args.scheduler:
            client.close()
    return 0 if ok else 1


def check_blocks(args, A, B, rf) -> bool:
    """Check ``args.check`` sampled output blocks against numpy; print and return the verdict."""
    rng = np.random.default_rng(args.seed)
    keys = sorted(rf)
    sample = [keys[i] for i in rng.choice(len(keys), size=min(args.check, len(keys)), replace=False)]
    worst = 0.0
    for i, j in sample:
        got = rf[(i, j)].result()
        ref = sum(A.load((i, k)) @ B.load((k, j)) for k in range(A.frontier[1]))
        worst = max(worst, float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref))))))
    tol = 1e-4 if np.dtype(args.dtype) == np.float32 else 1e-10
    ok = worst <= tol
    print(f"  check vs numpy on {len(sample)} sampled blocks {sample}: max relative error "
          f"{worst:.2e} (tolerance {tol:.0e}) -> {'OK' if ok else 'MISMATCH'}")
    return ok


def keep_until_interrupted(client, rf) -> None:
    """--keep: print the dashboard links, then wait for Ctrl-C."""
    # Ctrl-C must stop it even when this process was started with SIGINT ignored (Python then
    # installs no handler of its own: a parent that ignores it, a test runner's worker)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"  keeping the cluster up until Ctrl-C: dashboard {client.dashboard_link} "
          f"(this plan: {rf.dashboard_link})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("  stopped", flush=True)


# ---------------------------------------------------------------------------
# the command line


def parser() -> argparse.ArgumentParser:
    """``tra-dask [--version] [--debug] {run,explain} matmul [options]``."""
    debug = argparse.ArgumentParser(add_help=False)  # --debug after the subcommand too
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    workload = argparse.ArgumentParser(add_help=False, parents=[debug])
    workload.add_argument("--shape", choices=sorted(PAPER_SHAPES), default="general")
    workload.add_argument("--scale", type=float, default=0.05, help="fraction of the paper's sizes (default 0.05)")
    workload.add_argument("--blocks", type=int, default=4, help="chunks per matrix dim (default 4)")
    workload.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    workload.add_argument("--seed", type=int, default=0)
    workload.add_argument("--sites", type=int, default=None,
                          help=f"sites = Dask workers (default: all workers of --scheduler, else {EMBEDDED_SITES})")
    workload.add_argument("--compiled", action="store_true", help="the paper's compiled plan, not the optimizer's")

    p = argparse.ArgumentParser(prog="tra-dask", description="The paper's workloads on Dask, planned by the "
                                "tensor relational algebra: run them, or explain their plans.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = p.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser("run", help="run one of the paper's workloads").add_subparsers(dest="workload", required=True)
    mm = run.add_parser("matmul", parents=[workload], help="matrix multiply (paper §6.1)")
    mm.add_argument("--scheduler", default=None, metavar="ADDRESS",
                    help="address of a running Dask scheduler (default: an embedded cluster on 127.0.0.1)")
    for option, what in (("--tls-ca-file", "the CA certificate that signed the cluster's certificates"),
                         ("--tls-cert", "this client's certificate"), ("--tls-key", "this client's private key")):
        mm.add_argument(option, default=None, metavar="FILE", help=f"for a tls:// --scheduler: {what} (PEM)")
    mm.add_argument("--check", type=int, default=3, help="output blocks to check against numpy (default 3)")
    mm.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    mm.add_argument("--keep", action="store_true", help="keep the embedded cluster and its dashboard up until Ctrl-C")
    mm.set_defaults(command=run_matmul)

    explain = sub.add_parser("explain", help="print a workload's plan and predicted cost; run nothing")
    explain = explain.add_subparsers(dest="workload", required=True)
    explain.add_parser("matmul", parents=[workload], help="matrix multiply (paper §6.1)").set_defaults(
        command=explain_matmul)
    return p


def main(argv=None) -> int:
    """Run the command; its exit status (errors: one line on stderr, see the module doc)."""
    p = parser()
    args = p.parse_args(argv)
    if args.scale <= 0 or args.blocks <= 0 or (args.sites is not None and args.sites <= 0):
        p.error("--scale, --blocks and --sites must be positive")
    if getattr(args, "keep", False) and args.scheduler:
        p.error("--keep keeps the embedded cluster up; a --scheduler cluster stays up anyway")
    if any(getattr(args, f"tls_{x}", None) for x in ("ca_file", "cert", "key")) and not args.scheduler:
        p.error("--tls-ca-file, --tls-cert and --tls-key are for a tls:// --scheduler (the embedded cluster: "
                "tra_dask.runtime.embedded_client(security=True))")
    try:
        return args.command(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("tra-dask: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        message = " ".join(str(e).split())
        if isinstance(e, UsageError):
            print(f"tra-dask: error: {message}", file=sys.stderr)
            return 2
        print(f"tra-dask: error: {type(e).__name__}: {message} (--debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
