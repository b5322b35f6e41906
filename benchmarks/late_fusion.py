"""Does fusing late tasks into readers that are small granules pay?  (LATE_GRANULES)

The fusion pass (``tra_dask.physical.work``) runs a task inside its one reader on
the same site.  A task whose reader waits for a transfer ("late") used to fuse only
when it was cheap; now it also fuses when the reader, with everything it could take
in, is at most ``1/LATE_GRANULES`` of its site's work on its node.  For each case of
``time_model.py`` (matmul shapes x chunkings, nearest neighbour, the FFNN step) on a
calibrated LocalCluster, the time objective's plan with the rule (``granules``) and
without it (``LATE_GRANULES = 0``: ``before``) — planned again for every run, so each
is the plan the optimizer picks with or without the rule — run interleaved (each
round starting with the other one) on copies of one placement of the inputs
(``time_model.Inputs``).  Reports min and median wall, tasks and predicted seconds of
each, and the ratio of the minima.

    python benchmarks/late_fusion.py [--sites 2 3] [--scale 1.0] [--repeat 3] [--only matmul] [--no-write]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys

import dask

import tra_dask as td
import tra_dask.optimizer.time as time_model
from _harness import LoadWatch, machine_line, start_cluster
from time_model import Inputs, cases


def run_case(client, build, seed, repeat):
    """{label: (walls, tasks, predicted)} for the plan with and without the rule."""
    inputs = Inputs(client, seed)
    build(client, inputs.copy())  # the round's placement (Dask's persist)
    out = {"before": ([], 0, 0.0), "granules": ([], 0, 0.0)}
    default = time_model.LATE_GRANULES
    try:
        for r in range(repeat):
            for lab in (["before", "granules"] if r % 2 == 0 else ["granules", "before"]):
                time_model.LATE_GRANULES = 0 if lab == "before" else default
                plan = td.plan_for(build(client, inputs.copy()), client, objective="time")
                with LoadWatch(None) as w:
                    rf = td.submit(plan, client=client)
                    for one in rf if isinstance(rf, tuple) else (rf,):
                        one.wait()
                walls = out[lab][0] + [w.wall]
                out[lab] = (walls, plan.cost.tasks, plan.cost.seconds)
                del rf, plan
    finally:
        time_model.LATE_GRANULES = default
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, nargs="+", default=[2, 3])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    p.add_argument("--only", default="", help="run only the cases whose name contains this text (implies --no-write)")
    p.add_argument("--quick", action="store_true", help="2 workers, small, one dtype, 2 repeats; nothing written")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    if args.quick:
        args.sites, args.scale, args.repeat, args.dtype, args.write = [2], 0.05, 2, ["float64"], False
    args.write = args.write and not args.only
    seeds = itertools.count(1)
    lines, ratios = [], []
    with dask.config.set({"tra-dask.plan-cache": False}):  # each run plans under its own rule
        for sites in args.sites:
            client = start_cluster(sites)
            try:
                # (--quick, a smoke test: a kept spec where one is configured, else calibrated)
                td.set_cluster_spec(client, td.cluster_spec(client) if args.quick else td.calibrate(client))
                for name, dtype, build in cases(args.scale, args.dtype):
                    if args.only not in name:
                        continue
                    res = run_case(client, build, next(seeds), args.repeat)
                    (wb, tb, pb), (wg, tg, pg) = res["before"], res["granules"]
                    ratio = min(wg) / min(wb)
                    ratios.append(ratio)
                    row = (f"| {sites} | {name} | {dtype} | {min(wb):.3f} | {statistics.median(wb):.3f} | {tb} | "
                           f"{pb:.3f} | {min(wg):.3f} | {statistics.median(wg):.3f} | {tg} | {pg:.3f} | {ratio:.2f} |")
                    print(row, flush=True)
                    lines.append(row)
            finally:
                client.close()
    rs = sorted(ratios)
    summary = (f"granules / before (min over runs): median {statistics.median(rs):.2f}, range {rs[0]:.2f}-{rs[-1]:.2f}; "
               f"faster by more than 5% in {sum(r < 0.95 for r in rs)} of {len(rs)} cases, slower by more than 5% "
               f"in {sum(r > 1.05 for r in rs)}")
    print(summary)
    if args.write:
        from _report import write_section

        class A:  # machine_line wants .sites
            sites = "/".join(map(str, args.sites))

        write_section("late fusion into small granules", [
            f"`python benchmarks/late_fusion.py --repeat {args.repeat} --scale {args.scale}` — {machine_line(A)}", "",
            "The time objective's plan without the small-granule rule (before: late tasks fuse only when cheap) "
            "and with it, each planned again for every run, interleaved, on copies of one placement. " + summary + ".",
            "", "| workers | case | dtype | before min (s) | before median (s) | tasks | predicted (s) "
            "| granules min (s) | granules median (s) | tasks | predicted (s) | granules / before |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *lines])
    return 0


if __name__ == "__main__":
    sys.exit(main())
