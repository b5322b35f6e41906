"""Choosing the chunking: a block size per axis class, costed through the optimizer.

Axes that must be cut alike form one *class* (union-find over the links of
:mod:`.nodes`).  A class is *fixed* when data already has chunks along it (a dask
array, a TRA relation, ``from_array(x, chunks=...)``), and otherwise *free*; a
slice that does not keep whole blocks is a re-cut the plan costs, so block sizes on
its cut points are candidates too.  For the free classes
the chooser builds the TRA expression under candidate block sizes and asks the
optimizer for the best plan under each (its predicted seconds on the cluster, the
time objective with memory a hard limit): first every class at the same number of
blocks (1, p, 2p, p², … for p sites), then coordinate descent over each class's
candidates, until no single change helps.  Candidates come from the cluster size
(grids that fit p, p², p³ sites) and the extents; memory rules a candidate out
when no plan fits.  A dask array's chunks are a candidate of its class like any
other: keeping them costs nothing extra; under another candidate the plan re-cuts the
array's blocks where they live (:func:`~tra_dask.frontend.recut.rechunk`), its moves
and tasks costed with the rest.  With one site, free
classes get one block unless no plan then fits in memory.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from dataclasses import dataclass, field

from ..optimizer.objective import FastestTime
from ..optimizer.optimize import TRAFFIC_RATIO, NoPlanFits, band_note, within_band
from .nodes import Einsum, Leaf, Slice

__all__ = ["AxisClasses", "Choice", "check_chunking", "choose"]


def check_chunking(node) -> None:
    """The checks the chooser makes, made when an expression is written: arrays whose
    chunks are fixed (relations, ``from_array(x, chunks=...)``) cut every axis class
    alike, and an axis a reshape or concatenation needs whole is not cut (ValueErrors
    naming the arrays)."""
    cl = AxisClasses([node])
    for ci in range(len(cl.classes)):
        cl.pinned(ci)


class AxisClasses:
    """The axis classes of an expression DAG (``roots``)."""

    def __init__(self, roots):
        self.roots = tuple(roots)
        self.nodes = _topo(roots)
        parent: dict = {}

        def find(x):
            parent.setdefault(x, x)
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        def union(a, b):
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[rb] = ra

        for n in self.nodes:
            for a in range(n.ndim):
                find((n, a))
            for i, a, o in n.links():
                union((n.inputs[i], a), (n, o))
            for (i, a), (j, b) in n.ties():
                union((n.inputs[i], a), (n.inputs[j], b))
        roots_of = {}
        for m in list(parent):
            roots_of.setdefault(find(m), []).append(m)
        self.classes = list(roots_of.values())  # [[(node, axis), ...], ...]
        self.of = {m: ci for ci, ms in enumerate(self.classes) for m in ms}
        self.extent = [max(n.shape[a] for n, a in ms) for ms in self.classes]
        self.fixed: list[dict] = [{} for _ in self.classes]    # value -> [leaf names]
        self.rigid: list[dict] = [{} for _ in self.classes]    # relations, from_array(chunks=): not re-cut
        for n in self.nodes:
            if isinstance(n, Leaf) and n.chunks is not None:
                for a, b in enumerate(n.chunks):
                    if b is None:  # irregular dask chunks along this axis: not a candidate (re-chunked)
                        continue
                    ci = self.of[(n, a)]
                    self.fixed[ci].setdefault(b, []).append(n.name)
                    if n.kind in ("relation", "numpy", "function"):  # the user (or the relation) fixed them
                        self.rigid[ci].setdefault(b, []).append(n.name)
        self.given: list = [None] * len(self.classes)  # einsum(..., chunks=) of the user
        for n in self.nodes:
            if isinstance(n, Einsum) and n.chunks:
                want = dict(n.chunks)
                for i, a, c in n._axes():
                    if c in want:
                        self.given[self.of[(n.inputs[i], a)]] = want[c]
        self.cuts: list[list] = [[] for _ in self.classes]  # cut points of step-1 slices: blocks on them keep whole
        for n in self.nodes:
            if isinstance(n, Slice):
                x = n.inputs[0]
                for a, (start, step) in enumerate(n.bounds):
                    ci, stop = self.of[(x, a)], start + n.shape[a]
                    if step == 1 and start:
                        self.cuts[ci].append(start)
                    if step == 1 and stop != x.shape[a]:
                        self.cuts[ci].append(stop)
        self.whole: list = [None] * len(self.classes)  # why a class must be one block (a reshape, ...)
        for n in self.nodes:
            for i, a in n.whole():
                self.whole[self.of[(n if i is None else n.inputs[i], a)]] = type(n).__name__.lower()
        for ci, rigid in enumerate(self.rigid):
            if len(rigid) > 1:
                desc = "; ".join(f"{', '.join(v)} in blocks of {b}" for b, v in sorted(rigid.items()))
                raise ValueError(
                    f"arrays cut differently along one axis: {desc}; TRA relations and from_array(x, "
                    f"chunks=...) keep their chunks, so give them matching chunks (or let tra_dask choose: "
                    f"from_array(x) without chunks)"
                )

    def ok(self, ci: int, b: int) -> bool:
        return all(c % b == 0 for c in self.cuts[ci])

    def describe(self, ci: int) -> str:
        """A class named for people: its einsum index when the expression is one
        einsum, else the input axes it cuts (``X axis 0``)."""
        einsums = [n for n in self.nodes if isinstance(n, Einsum)]
        if len(einsums) == 1 and all(isinstance(i, Leaf) for i in einsums[0].inputs):
            n = einsums[0]
            letters = {n.out[o] for i, a, o in n.links() if self.of.get((n, o)) == ci}
            letters |= {n.subs[i][a] for (i, a), _ in n.ties() if self.of.get((n.inputs[i], a)) == ci}
            if letters:
                return "index " + "/".join(sorted(letters))
        leaves = sorted({f"{n.name} axis {a}" for n, a in self.classes[ci] if isinstance(n, Leaf)})
        if leaves:
            return " = ".join(leaves[:3]) + (" ..." if len(leaves) > 3 else "")
        n, a = self.classes[ci][0]
        return f"axis {a} of a {n.shape} result"

    def pinned(self, ci: int) -> list[int]:
        """The block sizes the data or the user fix for class ``ci`` (none: free);
        a ValueError when a slice cuts inside one of them."""
        n = self.extent[ci]
        pinned = list(self.rigid[ci]) or ([min(self.given[ci], max(1, n))] if self.given[ci] is not None else [])
        if self.whole[ci]:  # one block: no choice (and no search) for this class
            cut = [b for b in pinned if b < n]
            if cut:
                who = ", ".join(self.rigid[ci][cut[0]]) if self.rigid[ci] else "einsum(..., chunks=)"
                raise ValueError(
                    f"{self.whole[ci]} needs {self.describe(ci)} in one block (it merges, splits or concatenates "
                    f"along it), but {who} cuts it in blocks of {cut[0]}; give it one chunk along that axis "
                    f"(from_array(x, chunks=...), dask's rechunk) or let tra_dask choose the chunks")
            pinned = [n]
        return pinned

    def candidates(self, ci: int, sites: int, finer: bool = False) -> list[int]:
        """Block sizes to try for class ``ci``: its fixed chunks first, then grids
        that fit the cluster, and where a slice cuts the class, the same grids moved
        onto its cut points (there the slice re-cuts nothing); ``finer``: also
        grids of more blocks, up to one element a block (for a chunking whose blocks fit
        where none of the cluster's grids does)."""
        n = self.extent[ci]
        pinned = self.pinned(ci)
        if pinned:
            return pinned
        # grids that fit the sites: p per index, √p and ∛p (2-D and 3-D site grids),
        # and a few more blocks than sites (balance, overlap)
        roots = [r for r in (round(sites ** 0.5), round(sites ** (1 / 3))) if r ** 2 == sites or r ** 3 == sites]
        counts = [1, 2, *roots, sites, 2 * sites, 4 * sites]
        counts += [2 ** e for e in range(2, (4 * sites).bit_length())]  # grids on fewer sites
        if finer:
            counts += [2 ** e for e in range((4 * sites).bit_length(), max(n, 1).bit_length() + 1)] + [n]
        out = list(self.fixed[ci])
        g = 0  # blocks that divide every cut point keep the slices' blocks whole
        for c in self.cuts[ci]:
            g = math.gcd(g, c)
        for c in sorted(set(counts)):
            if c > n:
                break
            b = -(-n // c)
            if g and not self.ok(ci, b):  # the nearest block size on the cut points, too
                on = [d for d in _divisors(g) if d <= b]
                if on and on[-1] not in out and on[-1] * 4 >= b:
                    out.append(on[-1])
            if b not in out:
                out.append(b)
        if g and not any(self.ok(ci, b) for b in out):
            out.append(g)
        return out


def _divisors(g: int) -> list:
    """The divisors of ``g``, ascending."""
    small = [d for d in range(1, math.isqrt(g) + 1) if g % d == 0]
    return sorted(set(small + [g // d for d in small]))


def _topo(roots):
    seen, order = set(), []

    def visit(n):
        if id(n) in seen:
            return
        seen.add(id(n))
        for x in n.inputs:
            visit(x)
        order.append(n)

    for r in roots:
        visit(r)
    return order


@dataclass
class Choice:
    """The chunking chosen: a block size per class, the plan under it, and what
    was tried (``tried``: ``[(blocks, predicted seconds or None if infeasible)]``)."""

    classes: AxisClasses
    blocks: list
    plan: object = None
    seconds: float | None = None
    tried: list = field(default_factory=list)
    elapsed: float = 0.0
    why: str = ""

    def block(self, node, axis) -> int:
        return min(self.blocks[self.classes.of[(node, axis)]], max(1, node.shape[axis]))

    def describe(self) -> str:
        cl = self.classes
        parts = []
        for ci, b in enumerate(self.blocks):
            n = cl.extent[ci]
            if n <= 1:
                continue
            origin = ("fixed" if cl.rigid[ci] else "given" if cl.given[ci] is not None
                      else "kept" if b in cl.fixed[ci] else "chosen")
            parts.append(f"{cl.describe(ci)}: {-(-n // b)} block(s) of {b} ({origin})")
        return "; ".join(parts) or "one block"


FINALISTS = 2  # the best chunkings under the quick search, planned again in full ...
FINALIST_MARGIN = 1.1  # ... if within 10% of the best quick prediction
PLANNED = 3  # chunkings ranked by the analytic estimate: the best this many are planned ...
PLANNED_MARGIN = 1.25  # ... (after the first) if estimated within 25% of the best
EXHAUSTIVE = 512  # every combination of candidates is estimated up to this many
UNFIT = 8  # planned chunkings that fit no memory, beyond PLANNED, before the chooser gives up
PEAK_WEIGHT = 100.0  # grids finer than the cluster's: an estimate times 1 + this x the peak's excess over memory
FINER_TASKS = 16_384  # ... and none planned of more tasks (10⁶ block products take 12 s to plan)


def _uniform(cl, cands, free, start, counts) -> list:
    """``start``, and for each block count in ``counts`` every free class at the
    candidate nearest that count (distinct chunkings)."""
    out = [list(start)]
    for count in sorted(counts):
        b = list(start)
        for ci in free:
            want = -(-cl.extent[ci] // count)
            b[ci] = min(cands[ci], key=lambda x: abs(x - want))
        if b not in out:
            out.append(b)
    return out


def _descend(cands, free, start, starts, cost):
    """Coordinate descent from the best of ``starts``: one class at a time, until no
    single change lowers ``cost`` by more than 0.5%."""
    best = min(starts, key=cost)
    improved = True
    while improved:
        improved = False
        for ci in free:
            for b in cands[ci]:
                trial = list(best)
                trial[ci] = b
                if cost(trial) < cost(best) * 0.995:
                    best, improved = trial, True
    return best


def _least_traffic_candidate(ranked: list, tried: dict, estimate) -> tuple | None:
    """The chunking estimated within :data:`PLANNED_MARGIN` of the best, spread over as
    many sites (:meth:`~tra_dask.frontend.estimate.Estimator.spread`), that moves the
    fewest floats by the estimate (:meth:`~tra_dask.frontend.estimate.Estimator.moved`),
    when it moves a :data:`~tra_dask.optimizer.optimize.TRAFFIC_RATIO`-th or less of
    every chunking planned and is not planned yet; else None.  The estimate ranks by
    seconds, and a plan that moves far less within the model's error band is the time
    objective's choice (:func:`less_traffic_chunking`): it must be among those planned."""
    moved = getattr(estimate, "moved", None)
    planned = [k for k, v in tried.items() if v[1] < math.inf]
    if moved is None or not ranked or not planned or ranked[0][0] == math.inf:
        return None
    spread = getattr(estimate, "spread", lambda k: 0)
    wide = spread(list(ranked[0][1]))  # (no fewer sites than the fastest: idle sites are not what the band buys)
    near = [(moved(list(k)), v, k) for v, k in ranked
            if v <= ranked[0][0] * PLANNED_MARGIN and k not in tried and spread(list(k)) >= wide]
    if not near:
        return None
    floats, _, k = min(near)
    least_planned = min(moved(list(k2)) for k2 in planned)
    return k if floats < least_planned and floats * TRAFFIC_RATIO <= least_planned else None


def less_traffic_chunking(tried: dict, best: list) -> tuple[list, str]:
    """``(blocks, note)``: the time objective's rule under its own error
    (:func:`~tra_dask.optimizer.optimize.within_band`, as ``less_traffic`` applies it
    to plans) over the chunkings planned (``tried``: blocks -> (plan, predicted
    seconds)): the fastest is kept unless another it gives way to; then the fastest
    such, and the rule again from it.  ``note`` says what was passed over (empty when the fastest stands)."""
    cur, notes = tuple(best), []
    band = FastestTime().band  # (the Dask config's tra-dask.time-band, else the default)
    seen = {cur}
    while band:
        plan, seconds = tried[cur]
        if plan is None:
            break
        better = []
        for k, (p, s) in tried.items():
            if k in seen or p is None or s == math.inf:
                continue
            if within_band(seconds, plan.cost.floats_moved, s, p.cost.floats_moved, band):
                better.append((s, p.cost.floats_moved, k))
        if not better:
            break
        s, moved, k = min(better)
        notes.append(band_note("chunking", seconds, plan.cost.floats_moved, s, moved, band))
        seen.add(k)
        cur = k
    return list(cur), "".join(f"; {n}" for n in notes)


def choose(cl: AxisClasses, sites: int, evaluate, final=None, estimate=None, settled: bool = False,
           finer: bool = False, tried: dict | None = None) -> Choice:
    """The chunking of the expression whose axis classes are ``cl`` with the least
    predicted seconds.

    ``evaluate(blocks) -> (plan, seconds)`` builds and plans the expression under
    ``blocks`` (a block size per class); it raises ``NoPlanFits`` when no plan fits
    in memory.  ``estimate(blocks) -> seconds``, when given, is an analytic estimate
    (:class:`~tra_dask.frontend.estimate.Estimator`): every candidate chunking is
    ranked by it (all combinations, or coordinate descent where there are more than
    :data:`EXHAUSTIVE`) and only the best :data:`PLANNED` are planned by ``evaluate``
    (and the best of those again by ``final``, the kept plan's search, when given), going down the ranking
    while none fits in memory (past chunkings whose block products are as large as one
    that did not fit); the least predicted seconds of those planned wins.
    Without it every chunking tried is planned by ``evaluate`` (coordinate descent)
    and ``final`` plans the :data:`FINALISTS` best again with the full search.
    With no free class there is nothing to choose; with one site free classes get one
    block unless no plan then fits in memory, and the search looks for a chunking
    that does.  ``settled``: the caller compares nothing else under the chunking
    chosen (no contraction order left open), so a chunking chosen without planning
    any other is planned once, by ``final``, not by ``evaluate`` and again by ``final``.
    ``finer``: grids of more blocks than the cluster's too (tried where none of those
    fits); ``tried``: chunking -> ``(plan, seconds)`` of those planned before (``inf``
    seconds: it did not fit), not planned again.
    """
    t0 = time.perf_counter()
    traffic_note = ""
    cands = [cl.candidates(ci, sites, finer) for ci in range(len(cl.classes))]

    def again_finer():  # nothing fits in the cluster-sized grids: finer ones, before giving up
        if finer or all(cl.candidates(ci, sites, True) == c for ci, c in enumerate(cands)):
            return None
        try:
            return choose(cl, sites, evaluate, final, estimate, settled, finer=True, tried=tried)
        except NoPlanFits:
            return None

    free = [ci for ci, c in enumerate(cands) if len(c) > 1]
    tried = {} if tried is None else tried
    refusals: list = []  # what the plans that did not fit said (bytes needed against the limit)

    def cost(blocks):
        key = tuple(blocks)
        if key not in tried:
            try:
                tried[key] = evaluate(list(blocks))
            except NoPlanFits as e:
                tried[key] = (None, math.inf)
                refusals.append(str(e))
        return tried[key][1]

    # start: every class at its first candidate (fixed chunks / one block) ...
    start = [c[0] for c in cands]
    # ... or every free class at the same number of blocks, whichever is best
    starts = _uniform(cl, cands, free, start, {1, sites, 2 * sites, sites * sites})
    ranked = None
    # one site has nothing to spread: one block per free class, unless that does not fit
    search = bool(free) and (sites > 1 or cost(start) == math.inf)
    if search and estimate is not None:
        estimated: dict = {}

        over = finer and hasattr(estimate, "peak") and getattr(estimate, "memory", None)

        def guess(blocks):
            key = tuple(blocks)
            if key not in estimated:
                v = estimate(list(blocks))
                if over:  # grids finer than the cluster's, tried because none of those fits: the estimated
                    # peak over the memory per site weighs most (the descent goes to what fits; only
                    # what is estimated to fit is planned)
                    v *= 1 + PEAK_WEIGHT * max(0.0, estimate.peak(list(blocks)) / estimate.memory - 1)
                estimated[key] = v
            return estimated[key]

        if math.prod(len(cands[ci]) for ci in free) <= EXHAUSTIVE:
            for combo in itertools.product(*[cands[ci] for ci in free]):
                b = list(start)
                for ci, v in zip(free, combo):
                    b[ci] = v
                guess(b)
        else:  # descent from every class at each count of blocks
            top = max(cl.extent) if finer else 4 * sites
            for s0 in _uniform(cl, cands, free, start, {2 ** e for e in range(top.bit_length())} | {sites}):
                _descend(cands, free, start, [s0], guess)
        ranked = sorted((v, k) for k, v in estimated.items())
        footprint = getattr(estimate, "footprint", None)
        peak = getattr(estimate, "peak", None)
        planned = attempts = 0
        unfit = math.inf  # the smallest estimated peak of a chunking that did not fit
        alike: set = set()  # the estimates of the chunkings planned that fit
        for v, k in ranked:  # (an infinite estimate: a block product that fits no site's memory)
            if v == math.inf or planned >= PLANNED or (planned and v > ranked[0][0] * PLANNED_MARGIN):
                break
            if attempts >= PLANNED + UNFIT:
                break
            if peak is not None and not planned and peak(k) >= unfit:
                continue  # a site holds at least as much as in one that did not fit: the next smaller
            if over and (peak(k) > estimate.memory or estimate.tasks(k) > FINER_TASKS):
                continue  # a finer grid is planned only where it is estimated to fit, in few enough tasks
            twin = (v, _cut_counts(cl, k))
            if twin in alike:  # priced exactly as one planned that cuts as many classes of each extent
                planned += 1  # as many ways (a symmetric expression's mirror image, or block sizes that
                continue  # cut alike): that one's plan stands for it
            if k in tried:  # planned before (by a coarser pass, or as a start)
                if tried[k][1] < math.inf:
                    planned += 1
                    alike.add(twin)
                elif peak is not None:
                    unfit = min(unfit, peak(k))
                continue
            attempts += 1
            try:
                tried[k] = evaluate(list(k))
                planned += 1
                alike.add(twin)
            except NoPlanFits as e:
                tried[k] = (None, math.inf)
                refusals.append(str(e))
                if peak is not None:
                    unfit = min(unfit, peak(k))
        quiet = _least_traffic_candidate(ranked, tried, estimate)
        if quiet is not None:  # planned too, for the time objective's band to weigh (less_traffic_chunking)
            try:
                tried[quiet] = evaluate(list(quiet))
            except NoPlanFits as e:
                tried[quiet] = (None, math.inf)
                refusals.append(str(e))
        if not tried or all(v[1] == math.inf for v in tried.values()):
            got = again_finer()
            if got is not None:
                return got
        if not tried and footprint is not None:  # every chunking ruled out before planning
            raise NoPlanFits(_too_large_msg(cl, ranked, footprint, estimate.memory))
        if not tried or all(v[1] == math.inf for v in tried.values()):
            raise NoPlanFits(tried_msg(cl, tried or {k: None for _, k in ranked}, refusals))
        best = list(min(tried, key=lambda k: tried[k][1]))
        best, traffic_note = less_traffic_chunking(tried, best)
        if final is not None:  # the winner planned again with the kept plan's search
            try:
                tried[tuple(best)] = final(best)
            except NoPlanFits:
                pass
    elif search:
        best = _descend(cands, free, start, starts, cost)
    else:
        best = start
    if final is not None and search and estimate is None:
        ranked_q = sorted((v[1], k) for k, v in tried.items() if v[1] < math.inf)[:FINALISTS]
        ranked_q = [(t, k) for t, k in ranked_q if t <= ranked_q[0][0] * FINALIST_MARGIN]
        full = {}
        for _, k in ranked_q:
            try:
                full[k] = final(list(k))
            except NoPlanFits:
                pass
        if full:
            best, traffic_note = less_traffic_chunking(full, list(min(full, key=lambda k: full[k][1])))
            tried[tuple(best)] = full[tuple(best)]
    if tuple(best) in tried:
        plan, seconds = tried[tuple(best)]
    else:  # nothing was planned to choose it: the one plan, in full where nothing else is compared
        plan, seconds = final(best) if final is not None and settled else evaluate(best)
    if seconds == math.inf:
        raise NoPlanFits(tried_msg(cl, tried, refusals))
    choice = Choice(cl, best, plan, seconds, [(list(k), None if v[1] == math.inf else v[1]) for k, v in tried.items()],
                    time.perf_counter() - t0)
    n_tried = max(1, len(tried))
    if ranked is not None:
        choice.why = (f"{choice.describe()}; least predicted time of {n_tried} chunking(s) planned, the best "
                      f"of {len(ranked)} by an analytic estimate{traffic_note}")
    else:
        choice.why = (f"{choice.describe()}; least predicted time of {n_tried} chunking(s) tried"
                      + (" (the closest planned again in full)" if final is not None else "") + traffic_note
                      if len(tried) > 1 else choice.describe())
    return choice


def _cut_counts(cl: AxisClasses, blocks) -> tuple:
    """``(extent, blocks)`` of every axis class under block sizes ``blocks``, sorted:
    alike for a chunking and its mirror image."""
    return tuple(sorted((e, -(-e // max(1, min(b, e)))) for e, b in zip(cl.extent, blocks)))


def _too_large_msg(cl: AxisClasses, ranked: list, footprint, memory: float) -> str:
    """Why no chunking fits when none was planned: in every one, a block product's
    operands and result are more than a site's memory."""
    least = min(footprint(k) for _, k in ranked)
    return (f"no chunking fits in memory: in each of the {len(ranked)} chunking(s) of "
            f"{', '.join(cl.describe(ci) for ci in range(len(cl.classes)) if cl.extent[ci] > 1)} "
            f"ranked, one step's blocks (a product's operands and result, or its block products spread "
            f"over every site before they are summed) are more than a site holds, so none was planned; "
            f"the least any needs is {least:,.0f} bytes per site against the limit of {memory:,.0f} bytes; "
            f"use more workers or a larger limit")


def tried_msg(cl: AxisClasses, tried: dict, refusals=()) -> str:
    """Why no chunking fits: how many were planned, and the least memory any of their
    plans needed against the limit (``refusals``: the optimizer's NoPlanFits messages)."""
    need = [(int(m.group(2).replace(",", "")), m.group(1)) for r in refusals
            if (m := re.search(r"no plan fits in ([\d,]+) bytes per site.*?is ([\d,]+) bytes per site", r))]
    least = (f"; the least any needs is {min(need)[0]:,} bytes per site against the limit of {min(need)[1]} "
             f"bytes" if need else "")
    return (f"no chunking fits in memory: {len(tried)} chunking(s) of "
            f"{', '.join(cl.describe(ci) for ci in range(len(cl.classes)) if cl.extent[ci] > 1)} "
            f"were planned and none has a plan within the memory limit{least}; use more workers or a larger limit")
