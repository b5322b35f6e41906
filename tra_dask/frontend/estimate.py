"""An analytic estimate of a chunking's seconds, to rank candidate chunkings before
any is planned.

Planning one chunking (building its TRA expression and searching its IA plans) costs
tenths of a second; a chunk choice that planned every candidate grew with the
cluster (16.2 s for a 4096³ multiply on 16 sites, 42 chunkings).  The chooser
(:func:`tra_dask.frontend.chunking.choose`) ranks every candidate by this estimate
instead, which reads only the expression's shapes and the cluster's rates
(microseconds per candidate, independent of the number of sites), and plans the best
few in full; the plans' predicted seconds decide among those.  The estimate is the
time model's terms (:mod:`tra_dask.optimizer.time`) for an idealised plan of each
node:

* a contraction (each step of an einsum's contraction path) runs on a grid of sites
  over its indices — ``p[l]`` sites along index ``l``, at most its blocks, their
  product at most the sites — found greedily (the index whose doubling saves the most
  first): each site runs its share of the block products, receives its block of every
  operand not already there (an operand is replicated over the grid's indices it
  lacks), and sends its partial result to be summed when a contracted index is split;
  a block product runs at the time model's rate for what it does (a GEMM at the BLAS
  rate of its size, a row dot or an outer product at the pace of memory:
  :func:`~tra_dask.optimizer.time.call_rate`);
* any other node runs on as many sites as it has blocks, at the elementwise rate, and
  moves nothing (its inputs are cut alike) — but a slice or gather that re-cuts an
  axis has a task per piece, and its pieces move unless the other axes spread the work;
* a step that keeps only some of a host's workers busy runs as the time model's
  :func:`~tra_dask.optimizer.time.busiest` says (a host whose workers run faster
  while others idle: more workers than cores, or rates measured alone), its busy
  sites the first ones, where the plans put fewer blocks than sites;
* every block product, summed output block, elementwise block and loaded chunk is a
  task (the per-task overhead); the results' way to the client where the call
  gathers them (the time model's :func:`~tra_dask.optimizer.time.gather_seconds`); a block step that does not fit in a site's memory
  (a product's operand and result blocks, or any other node's input and output
  blocks) rules the chunking out (``inf``), and so does a contraction whose block
  products, held until they are summed — the result's bytes times the blocks of its
  summed indices — are more than all the sites hold (cutting the summed index of a
  80000x10000x80000 multiply 8 ways on 64 sites of 4 GB: 6.4 GB a site at best); a
  dask input cut otherwise is re-chunked (``rechunk(arr, blocks)`` seconds, the
  chooser's).

A join whose operands, whole, are more than all the sites hold (with its result, where
that is an output or another step's operand) fits in no chunking
(:meth:`Estimator.least_held`): the chooser refuses at once, naming it.

Nodes follow one another (no overlap): an estimate, not a bound — the chooser plans
several candidates for that reason.
"""

from __future__ import annotations

import math

import numpy as np

from ..optimizer.time import busiest, call_rate, gather_seconds, kernel_class, op_cost
from .chunk_ops import einsum_kernel
from .einsum import contraction_paths
from ..logical import piece_table
from .nodes import Einsum, Elementwise, Gather, Leaf, Reduce, Reshape, ScalarOp, Slice, Take, Unary, Where
from .recut import aligned

__all__ = ["Estimator"]


class Estimator:
    """``Estimator(classes, sites, spec)(blocks) -> seconds`` (``blocks``: a block
    size per axis class of ``classes``, an :class:`~tra_dask.frontend.chunking.AxisClasses`);
    ``paths``: einsum node -> its contraction path (default: opt_einsum's best);
    ``rechunk(arr, chunks) -> seconds`` for a dask input cut other than it is."""

    def __init__(self, classes, sites: int, spec, paths=None, rechunk=None):
        self.cl, self.sites, self.spec = classes, sites, spec
        self.roots = list(dict.fromkeys(classes.roots))
        self.paths = dict(paths or {})
        self.rechunk = rechunk
        gpu = spec.gpu
        self.threads = 1 if gpu is not None else spec.threads
        self.link = spec.link_bandwidth
        self.fresh = spec.fresh_bandwidth if gpu is None else gpu.elementwise * 24 / gpu.sharing
        self.memory = spec.memory_budget
        self.launch = 0.0 if gpu is None else gpu.launch
        # the numpy inputs each submission hashes (the time model's ``named`` term): the same for every chunking
        named = {id(n.data): n.data.nbytes for n in classes.nodes
                 if isinstance(n, Leaf) and n.kind == "numpy" and isinstance(n.data, np.ndarray)}
        self.naming = sum(named.values()) / spec.hash_bandwidth
        self._derived: dict = {}  # blocks -> (footprint, peak, tasks, floats moved, sites spread) of their estimate
        self._moved = self._step_moved = 0.0
        self._grid = self._step_grid = 0
        # nodes whose chunks need not be made: maps that may run inside their reader's kernel
        # (an elementwise result read only by maps and per-chunk reductions, as (a * b + 1).sum(0))
        readers: dict = {}
        for n in classes.nodes:
            for i in n.inputs:
                readers.setdefault(id(i), []).append(n)
        roots = {id(r) for r in self.roots}
        self._inside = {id(n) for n in classes.nodes
                        if isinstance(n, (Elementwise, Where, Unary, ScalarOp)) and id(n) not in roots
                        and readers.get(id(n)) and all(isinstance(r, (Unary, ScalarOp, Reduce)) and len(r.inputs) == 1
                                                       for r in readers[id(n)])}
        # nodes read only by slices: a plan makes only the blocks the slices read (A[:, :k // 2])
        self._sliced = {id(n): readers[id(n)] for n in classes.nodes
                        if id(n) not in roots and readers.get(id(n))
                        and all(isinstance(r, Slice) for r in readers[id(n)])}
        self._piece_counts: dict = {}  # (gather node, block in, block out) -> its pieces
        self._contracts: dict = {}  # a contraction step's (seconds, tasks, footprint, peak) by what it reads
        self._paces: dict = {}  # (sites busy, kernel class) -> the time model's multiple of a busy site's seconds

    # -- rates -------------------------------------------------------------------------
    def _elementwise_rate(self, dtype) -> float:
        narrow = 8 / max(min(np.dtype(dtype).itemsize, 16), 2)
        if self.spec.gpu is not None:
            return self.spec.gpu.elementwise * narrow / self.spec.gpu.sharing
        return self.spec.rates["elementwise"] * narrow

    def _pace(self, used: int, cls) -> float:
        """What a step that keeps ``used`` sites equally busy takes, as a multiple of
        one busy site's seconds at the spec's rates: the time model's
        :func:`~tra_dask.optimizer.time.busiest` of that load (``cls``: the kernel
        class, None for a transfer), the busy sites the first ones (a plan puts fewer
        blocks than sites on the first sites: on several hosts, the first host's
        workers before the next host's).  1 where no
        host's workers run faster while others idle; on one shared host of 4 workers
        on 2 cores, a step on 2 of them runs at the rate alone."""
        if not self.spec.shared_hosts:
            return 1.0
        used = max(1, min(int(used), self.sites))
        key = (used, cls)
        got = self._paces.get(key)
        if got is None:
            v = np.zeros(self.spec.sites)
            v[:used] = 1.0  # the first sites, as the plans' placements of fewer blocks than sites use them
            got = self._paces[key] = busiest(v, self.spec, cls)
        return got

    # -- the estimate ------------------------------------------------------------------
    def __call__(self, blocks) -> float:
        cl = self.cl
        seconds, tasks = 0.0, 0
        self._footprint = self._peak = 0.0
        self._moved, self._grid = 0.0, 0
        for n in cl.nodes:
            nb = [self._nblocks(n, a, blocks) for a in range(n.ndim)]
            if not isinstance(n, Einsum) and not self._fits(n, blocks):
                self._derived[tuple(blocks)] = (self._footprint, math.inf, 0, math.inf, 0)
                return math.inf
            if isinstance(n, Leaf):
                tasks += math.prod(nb)
                if n.kind == "dask" and self.rechunk is not None:
                    cut = tuple(min(blocks[cl.of[(n, a)]], max(1, n.shape[a])) for a in range(n.ndim))
                    if n.chunks is None or tuple(n.chunks) != cut:
                        seconds += self.rechunk(n.data, cut)
                continue
            if isinstance(n, Einsum):
                s, t = self._einsum(n, blocks)
            else:
                s, t = self._other(n, nb, blocks)
                if isinstance(n, (Slice, Gather, Reshape)):
                    s2, t2 = self._recut(n, blocks)
                    s, t = s + s2, t + t2
            if s == math.inf:
                self._derived[tuple(blocks)] = (self._footprint, math.inf, 0, math.inf, 0)  # (the footprint: what the refusal says)
                return math.inf
            seconds += s
            tasks += t
        self._derived[tuple(blocks)] = (self._footprint, self._peak, tasks, self._moved, self._grid)
        results = [(math.prod(r.shape) * np.dtype(r.dtype).itemsize,
                    math.prod(self._nblocks(r, a, blocks) for a in range(r.ndim))) for r in self.roots]
        seconds += gather_seconds(results, self.spec) + self.naming
        return self.spec.submit_overhead + tasks * (self.spec.task_overhead + self.launch) + seconds

    def footprint(self, blocks) -> float:
        """Bytes of the largest block step under ``blocks`` (after the estimate of
        ``blocks``): a block product's operands and result, or the input and output
        blocks of any other step (a chunk made, a map, a reduction): the smaller, the
        less a plan holds at once."""
        return self._derive(blocks)[0]

    def peak(self, blocks) -> float:
        """The most bytes a site holds at once under ``blocks``, as the cost model
        counts a node's peak (its own and its inputs' chunks on a site, and twice its
        largest chunk in flight): for each step, its operands' and result's shares on
        the sites the step runs on (a contraction's on the grid the estimate found —
        or, where that holds more than a site's memory, the grid a plan that fits
        would spread it over, its seconds still the fastest grid's — an operand replicated over the grid's indices it lacks,
        and the block products a site makes, held until they are summed; a
        reduction's partial result per input block, held until summed), plus twice
        the step's largest block; a map that may run inside its reader's kernel counts
        nothing (``(a * b + 1).sum(0)`` never makes ``a * b``), a node read only by
        slices its blocks they read (``A[:, :k // 2]``); ``inf`` where a block step does
        not fit at all.  A guide, not a bound (a plan may hold more or less): until a
        chunking fits, the chooser passes over one whose peak is no smaller than one
        that did not fit, and plans a grid finer than the cluster's only where it is
        no more than the memory."""
        return self._derive(blocks)[1]

    def tasks(self, blocks) -> int:
        """The tasks of the idealised plan the estimate of ``blocks`` prices (0 where
        it is ``inf``)."""
        return self._derive(blocks)[2]

    def moved(self, blocks) -> float:
        """Floats the contractions' idealised plans move under ``blocks`` (each operand
        piece to the grid's other sites that need it, each partial product once to be
        summed; ``inf`` where the estimate is): the chooser plans the chunking of least
        traffic near the fastest, for the time objective's band to weigh."""
        return self._derive(blocks)[3]

    def spread(self, blocks) -> int:
        """The most sites a contraction's idealised grid uses under ``blocks``."""
        return self._derive(blocks)[4]

    def _derive(self, blocks) -> tuple:
        if tuple(blocks) not in self._derived:
            self(blocks)
        return self._derived[tuple(blocks)]

    def least_held(self, orders: dict) -> tuple | None:
        """``(bytes, step)``: the most any plan of the expression holds at once while one
        join runs, whatever the chunking — an elementwise join's or a contraction
        step's distinct operands, each held whole somewhere (the cost model's peak of
        a node: its own and its inputs' tuples on a site), and its result where that is
        an output or another step's operand — for the contraction order of the
        ``orders`` (einsum node -> candidate paths; others as estimated) that holds
        least; None where no join reads its inputs whole (a slice, gather or take above
        it may need only part of them).  A map above a join may run inside its kernel
        (``(a * b).sum(0)``: each pair's chunk summed as it is made), so a result that
        is not an output counts nothing; a map below may run inside it too, so an
        operand counts as the least of it and the maps it is made by (:func:`_made_by_maps`).
        At more than ``memory`` times the sites, no chunking has a plan that fits."""
        partial: set = set()  # nodes whose readers may read part of them
        for n in reversed(self.cl.nodes):
            if isinstance(n, (Slice, Gather, Take)) or id(n) in partial:
                partial.update(id(i) for i in n.inputs)
        roots = {id(r) for r in self.roots}
        worst = None
        for n in self.cl.nodes:
            if id(n) in partial:
                continue
            if isinstance(n, (Elementwise, Where)):
                got = ((_bytes(n) if id(n) in roots else 0) + _distinct([_made_by_maps(i) for i in n.inputs]),
                       f"the elementwise {n.op if isinstance(n, Elementwise) else 'where'} of shape {n.shape}")
            elif isinstance(n, Einsum) and len(n.subs) > 1:
                got = min(self._held_by_path(n, path, id(n) in roots)
                          for path in orders.get(n) or [self.paths.get(n) or self._default_path(n)])
            else:
                continue
            if worst is None or got[0] > worst[0]:
                worst = got
        return worst

    def _held_by_path(self, n: Einsum, path, output: bool) -> tuple:
        """``(bytes, step)``: the step of ``path`` whose distinct operands and result
        are the most bytes (the last step's result only where ``n`` is an ``output``)."""
        sizes, itemsize = dict(n.sizes), np.dtype(n.dtype).itemsize
        terms = [(sub, *reversed(_made_by_maps(x)), min(np.dtype(x.dtype).itemsize, itemsize))
                 for sub, x in zip(n.subs, n.inputs)]
        worst = (0, "")
        for k, step in enumerate(path):
            group = [terms[i] for i in step]
            rest = [t for i, t in enumerate(terms) if i not in step]
            needed = set(n.out).union(*(t[0] for t in rest)) if rest else set(n.out)
            out = "".join(c for c in sorted(set().union(*(t[0] for t in group))) if c in needed)
            made = math.prod(sizes[c] for c in out) * itemsize
            if len(group) == 2:  # (a step of three runs pairwise: no two-operand bound for it)
                # an operand's indices no other term and not the result has are summed out
                # before the join (frontend.build: 'ij,jk->' joins the sums over i and over k)
                ins = []
                for j, (sub, b, ident, size) in enumerate(group):
                    keep = set(sub) & (needed | set(group[1 - j][0]))
                    if keep != set(sub):
                        b = min(b, math.prod(sizes[c] for c in keep) * size)
                        ident = (ident, tuple(sorted(keep)))
                    ins.append((ident, b))
                held = (made if rest or output else 0) + _distinct(ins)
                if held > worst[0]:
                    worst = (held, f"the contraction {','.join(t[0] for t in group)}->{out} of "
                                   f"{','.join(n.subs)}->{n.out}")
            terms = rest + [(out, made, ("step", k), itemsize)]
        return worst

    def _block_bytes(self, node, blocks) -> float:
        """Bytes of ``node``'s largest block under ``blocks``."""
        return math.prod(min(blocks[self.cl.of[(node, a)]], max(1, node.shape[a])) for a in range(node.ndim)) \
            * np.dtype(node.dtype).itemsize

    def _fits(self, node, blocks) -> bool:
        """Whether one step of a node other than a contraction — its input blocks and
        its output block — fits a site's memory (the footprint updated)."""
        steps = (node, *node.inputs)
        work = sum(self._block_bytes(x, blocks) for x in steps)
        self._footprint = max(self._footprint, work)
        made = [x for x in steps if id(x) not in self._inside]  # (a map run inside its reader makes nothing)
        partials = 0.0  # a reduction across blocks: a partial result per input block, held until summed
        if isinstance(node, Reduce):
            nbx = math.prod(self._nblocks(node.inputs[0], a, blocks) for a in range(node.inputs[0].ndim))
            if nbx > math.prod(self._nblocks(node, a, blocks) for a in range(node.ndim)):
                partials = -(-nbx // min(self.sites, nbx)) * self._block_bytes(node, blocks)
        self._peak = max(self._peak, sum(self._share(x, blocks) for x in made) + partials
                         + 2 * max([self._block_bytes(x, blocks) for x in made], default=0))
        return work <= self.memory

    def _share(self, node, blocks) -> float:
        """Bytes of ``node``'s blocks on the busiest site, its blocks dealt round the
        sites (of a node read only by slices, the blocks they read)."""
        nb = math.prod(self._nblocks(node, a, blocks) for a in range(node.ndim))
        if id(node) in self._sliced:
            nb = min(nb, max(math.prod(self._touched(node, r, a, blocks) for a in range(node.ndim))
                             for r in self._sliced[id(node)]))
        return -(-nb // min(self.sites, nb)) * self._block_bytes(node, blocks) if nb else 0.0

    def _touched(self, node, sl, axis, blocks) -> int:
        """Blocks of ``node`` along ``axis`` the slice ``sl`` reads (at most one per element)."""
        length = sl.shape[axis]
        if length == 0:
            return 0
        start, step = sl.bounds[axis]
        blk = min(blocks[self.cl.of[(node, axis)]], max(1, node.shape[axis]))
        last = start + step * (length - 1)
        lo, hi = min(start, last), max(start, last)
        return min(length, hi // blk - lo // blk + 1)

    def _nblocks(self, node, axis, blocks) -> int:
        n = node.shape[axis]
        b = min(blocks[self.cl.of[(node, axis)]], max(1, n))
        return max(1, -(-n // b))

    def _other(self, n, nb, blocks) -> tuple[float, int]:
        """An elementwise-like node (a map, a reduction, a permutation, a slice ...):
        its input elements at the elementwise rate, on as many sites as it has
        blocks; one task per block (per input block for a reduction)."""
        x = max((i for i in n.inputs), key=lambda i: math.prod(i.shape), default=None)
        elems = max(math.prod(n.shape), math.prod(x.shape) if x is not None else 0)
        nblocks = math.prod(nb)
        if x is not None and math.prod(x.shape) > math.prod(n.shape):  # a reduction: one task per input block
            nblocks = max(nblocks, math.prod(self._nblocks(x, a, blocks) for a in range(x.ndim)))
        used = min(self.sites, nblocks)
        per_site = math.ceil(nblocks / used) * elems / nblocks
        made = math.ceil(nblocks / used) * math.prod(n.shape) / max(1, math.prod(nb)) * np.dtype(n.dtype).itemsize
        return (per_site * self._op_cost(n) / (self._elementwise_rate(n.dtype) * self.threads) + made / self.fresh) \
            * self._pace(used, "elementwise"), nblocks

    def _op_cost(self, n) -> float:
        """What an elementwise node costs per element, in adds (:func:`~tra_dask.optimizer.time.op_cost`;
        one on a GPU)."""
        if self.spec.gpu is not None:
            return 1.0
        exp = self.spec.exp_cost
        if isinstance(n, Unary):
            return op_cost(n.kernel, exp_cost=exp)
        if isinstance(n, Elementwise):
            return op_cost(n.op, exp_cost=exp)
        if isinstance(n, ScalarOp):
            return op_cost(n.op, None if n.reflected else n.value, exp)
        return 1.0

    def _recut(self, n, blocks) -> tuple[float, int]:
        """A slice's or gather's re-cuts (:mod:`.recut`), axis by axis: a task per
        piece and per output block, and the pieces that are not their output block's
        first cross the network (the first stays where the block is made) — unless
        the other axes have the blocks to spread the work without moving anything."""
        seconds, tasks = 0.0, 0
        others = math.prod(self._nblocks(n, a, blocks) for a in range(n.ndim))
        for a, pieces in self._pieces(n, blocks):
            nout = self._nblocks(n, a, blocks)
            rest = others // nout  # blocks along the other axes
            tasks += (pieces + nout) * rest
            if rest < self.sites and pieces > nout:  # the pieces move
                moved = math.prod(n.shape) * np.dtype(n.dtype).itemsize * (pieces - nout) / pieces
                seconds += moved * (1 - 1 / self.sites) / self.link
        return seconds, tasks

    def _pieces(self, n, blocks):
        """``(axis, pieces)`` of each axis ``n`` re-cuts under ``blocks``."""
        x = n.inputs[0]

        def cut(a):
            return (min(blocks[self.cl.of[(x, a)]], max(1, x.shape[a])),
                    min(blocks[self.cl.of[(n, a)]], max(1, n.shape[a])))

        if isinstance(n, Reshape):  # a merged group's runs (its first axis's blocks) re-cut to the output's
            for g in n.groups:
                if n.merged(g):
                    (a0, *rest), (o,) = g
                    run = min(blocks[self.cl.of[(x, a0)]], max(1, x.shape[a0])) * math.prod(x.shape[a] for a in rest)
                    out = min(blocks[self.cl.of[(n, o)]], max(1, n.shape[o]))
                    if not aligned(n.shape[o], run, 0, 1, n.shape[o], out):
                        yield o, -(-n.shape[o] // run) + -(-n.shape[o] // out)
            return
        if isinstance(n, Gather):
            blk, out = cut(n.axis)
            key = (n, blk, out)
            if key not in self._piece_counts:
                self._piece_counts[key] = len(piece_table(x.shape[n.axis], blk, n.index.values, out, n.step))
            yield n.axis, self._piece_counts[key]
            return
        for a, (start, step) in enumerate(n.bounds):
            ext, length = x.shape[a], n.shape[a]
            blk, out = cut(a)
            if (start, step, length) == (0, 1, ext) or (blk >= ext and out >= length) \
                    or aligned(ext, blk, start, step, length, out):
                continue
            nout = -(-length // out)
            yield a, min(nout + -(-ext // blk), nout * (-(-out * abs(step) // blk) + 1))

    def _einsum(self, n: Einsum, blocks) -> tuple[float, int]:
        letters: dict = {}  # letter -> block count
        for i, a, c in n._axes():
            letters[c] = self._nblocks(n.inputs[i], a, blocks)
        for o, c in enumerate(n.out):
            letters.setdefault(c, self._nblocks(n, o, blocks))
        sizes = dict(n.sizes)
        terms = [sub for sub in n.subs]
        path = self.paths.get(n)
        if path is None:
            path = self._default_path(n)
        seconds, tasks = 0.0, 0
        itemsize = np.dtype(n.dtype).itemsize
        complex_ = np.dtype(n.dtype).kind == "c"
        for i, sub in enumerate(terms if len(terms) > 1 else ()):
            # letters no other operand nor the result has are summed out of an operand first (frontend.build)
            others = set(n.out).union(*(set(t) for j, t in enumerate(n.subs) if j != i))
            uniq = "".join(dict.fromkeys(sub))
            kept = "".join(c for c in uniq if c in others)
            if kept != uniq:
                s, t = self._reduce_step(uniq, kept, sizes, letters, n.dtype)
                seconds += s
                tasks += t
                x = n.inputs[i]
                self._peak = max(self._peak, self._share(x, blocks) * (1 + math.prod(sizes[c] for c in kept)
                                                                       / math.prod(sizes[c] for c in uniq))
                                 + 2 * self._block_bytes(x, blocks))
                terms[i] = kept
        for step in path:
            group = [terms[i] for i in step]
            rest = [t for i, t in enumerate(terms) if i not in step]
            needed = set(n.out).union(*rest) if rest else set(n.out)
            involved = "".join(sorted(set().union(*group)))
            out = "".join(c for c in involved if c in needed)
            if len(group) == 1:  # a reduction of one operand
                s, t = self._reduce_step(group[0], out, sizes, letters, n.dtype)
            else:
                s, t = self._contract(group, out, involved, sizes, letters, itemsize, complex_, n.dtype)
            if s == math.inf:
                return s, 0
            seconds += s
            tasks += t
            terms = rest + [out]
        return seconds, tasks

    def _default_path(self, n: Einsum):
        if n not in self.paths:
            if len(n.subs) < 2:
                self.paths[n] = ((0,),) if n.subs and set(n.subs[0]) != set(n.out) else ()
            else:
                self.paths[n] = contraction_paths(list(n.subs), n.out, dict(n.sizes))[0]
        return self.paths[n]

    def _reduce_step(self, sub, out, sizes, letters, dtype) -> tuple[float, int]:
        elems = math.prod(sizes[c] for c in sub)
        nblocks = math.prod(letters[c] for c in sub)
        used = min(self.sites, nblocks)
        return math.ceil(nblocks / used) * elems / nblocks / (self._elementwise_rate(dtype) * self.threads) \
            * self._pace(used, "elementwise"), nblocks

    def _contract(self, group, out, involved, sizes, letters, itemsize, complex_, dtype) -> tuple[float, int]:
        """One contraction step: its seconds on the best grid of sites found
        greedily (module doc), and its tasks — memoised on what they depend on (a
        descent changes one class at a time: most steps are estimated before)."""
        key = (tuple(group), out, tuple((sizes[c], letters.get(c, 1)) for c in involved), itemsize, complex_,
               str(dtype))
        hit = self._contracts.get(key)
        if hit is None:
            before, self._footprint = (self._footprint, self._peak), 0.0
            self._peak = self._step_moved = self._step_grid = 0.0
            s, t = self._contract_once(group, out, involved, sizes, letters, itemsize, complex_, dtype)
            hit = self._contracts[key] = (s, t, self._footprint, self._peak, self._step_moved, self._step_grid)
            self._footprint, self._peak = before
        self._footprint = max(self._footprint, hit[2])
        self._peak = max(self._peak, hit[3])
        self._moved += hit[4]
        self._grid = max(self._grid, hit[5])
        return hit[0], hit[1]

    def _contract_once(self, group, out, involved, sizes, letters, itemsize, complex_, dtype) -> tuple[float, int]:
        b = [letters.get(c, 1) for c in involved]
        pos = {c: i for i, c in enumerate(involved)}
        calls = math.prod(b)
        flops = 2.0 * math.prod(sizes[c] for c in involved) * (4 if complex_ else 1)
        per_call = flops / calls
        chunk = [sizes[c] / n for c, n in zip(involved, b)]
        ins = [[pos[c] for c in g] for g in group]
        outs = [pos[c] for c in out]
        contracted = [i for i, c in enumerate(involved) if c not in out]
        work = sum(math.prod(chunk[i] for i in g) for g in ins) + math.prod(chunk[i] for i in outs)
        # the join holds every block product before they are summed: the result times the
        # blocks of the summed indices, over all the sites at best
        partials = math.prod(sizes[c] for c in out) * itemsize * math.prod(b[i] for i in contracted) / self.sites
        self._footprint = max(self._footprint, work * itemsize, partials)
        if work * itemsize > self.memory or partials > self.memory:
            return math.inf, 0  # one product's operands and result, or the products held at once, do not fit
        sub = ",".join(group) + "->" + out
        # (a step of three or more operands runs pairwise, frontend.build: priced at the
        # memory-bound rate, as no single GEMM)
        kernel = einsum_kernel(sub) if len(group) <= 2 else None
        rate = call_rate(kernel, [tuple(max(1, math.ceil(chunk[pos[c]])) for c in g) for g in group],
                         np.dtype(dtype), self.spec) * self.threads
        cls = kernel_class(kernel)
        out_blocks = math.prod(b[i] for i in outs)
        out_size = math.prod(sizes[c] for c in out)
        inputs = [(g, math.prod(sizes[c] for c in grp), min(math.prod(b[i] for i in g), self.sites))
                  for g, grp in zip(ins, group)]
        out_chunk = math.prod(chunk[i] for i in outs) * itemsize
        cost_per_float = itemsize / self.link
        # a matrix product whose grid splits only the summed index may fold its partial
        # products by a tree (the optimizer's cmm_tree, fan-in 2): each site receives one
        # partial of every result chunk per level, at the cost of a fold task per pair
        matrix = len(group) == 2 and all(len(g) == 2 for g in group) and len(contracted) == 1
        overhead = self.spec.task_overhead

        def folding(p, grid, split) -> tuple[float, int]:
            """(seconds a busy site spends receiving the partial sums, with the tree's
            fold tasks' overhead; the tree's fold tasks, 0 for the flat fold)."""
            if split == 1:
                return 0.0, 0
            flat = out_size * (split - 1) / min(out_blocks, grid) * cost_per_float
            if not matrix or split < 4 or any(p[i] > 1 for i in outs):
                return flat, 0
            folds = out_blocks * (split - 1)
            up = out_size * math.ceil(math.log2(split)) * cost_per_float + folds * overhead
            return (up, folds) if up < flat else (flat, 0)

        def seconds(p, grid):
            per_site_calls = 1
            for n, q in zip(b, p):
                per_site_calls *= -(-n // q)
            recv = send = 0.0  # floats a busy site receives and sends
            for g, size, holders in inputs:
                pieces = 1
                for i in g:
                    pieces *= p[i]
                copies = grid // pieces  # the grid's sites that need each piece
                if copies > 1:  # each piece from the site that holds it (its chunks are spread)
                    recv += size / pieces * (copies - 1) / copies
                    send = max(send, size / holders * (copies - 1))
            split = 1
            for i in contracted:
                split *= p[i]
            if split > 1:  # partial sums folded onto one site of each result chunk (or by a tree)
                send += out_size * split / grid
            fold, _ = folding(p, grid, split)
            # a busy site's seconds, paced as the time model paces the grid's load (a host's idle
            # workers leave their share to the busy ones)
            return ((per_site_calls * per_call / rate + per_site_calls * out_chunk / self.fresh) * self._pace(grid, cls)
                    + (recv + send) * cost_per_float * self._pace(grid, None) + fold)

        largest = max([math.prod(chunk[i] for i in g) for g in ins] + [math.prod(chunk[i] for i in outs)])

        def peak(p):  # a site's share of each operand on grid p, the block products it makes (held
            # until summed), and two blocks in flight
            calls_here = math.prod(-(-n // q) for n, q in zip(b, p))
            held = sum(size / math.prod(p[i] for i in g) for g, size, _ in inputs) \
                + calls_here * math.prod(chunk[i] for i in outs)
            return (held + 2 * largest) * itemsize

        def greedy(score, through=False):  # from one site, double the index that lowers score(p, grid) the most
            p, grid = [1] * len(b), 1  # (through: on past a doubling that lowers nothing, the best visited kept)
            best = score(p, grid)
            visited = [(best, p, grid)]
            while grid * 2 <= self.sites:
                trial = None
                for i, n in enumerate(b):
                    if p[i] < n:
                        q = list(p)
                        q[i] = min(n, p[i] * 2)
                        g = grid // p[i] * q[i]
                        if g <= self.sites:
                            t = score(q, g)
                            if trial is None or t < trial[0]:
                                trial = (t, q, g)
                if trial is None or (trial[0] >= best and not through):
                    break
                best, p, grid = trial
                visited.append((best, p, grid))
            if through:
                best, p, _ = min(visited, key=lambda v: v[0])
            return best, p, visited

        # on a shared host the pace rises where a host's idle workers run out (4 workers of a host
        # on 4 cores busy, then 8): a grid twice as large may then lower nothing, and one four
        # times as large halve the seconds
        best, p, _ = greedy(seconds, through=bool(self.spec.shared_hosts))
        self._peak = peak(p)
        split = math.prod(p[i] for i in contracted)
        grid = math.prod(p)
        self._step_grid = grid
        self._step_moved = out_size * (split - 1) + sum(
            size * (grid // math.prod(p[i] for i in g) - 1) for g, size, _ in inputs)
        if self._peak > self.memory:  # the fastest grid holds too much: a plan that fits spreads the
            # products further (the grids on the way to the least held: the fastest of them that fits,
            # else the least held) — its peak is the guide; the seconds stay the fastest grid's
            _, _, visited = greedy(lambda q, g: peak(q))  # (scored by the peak: each visited's is its first)
            fit = [(seconds(q, g), held) for held, q, g in visited if held <= self.memory]
            self._peak = min(fit)[1] if fit else visited[-1][0]
        tasks = calls + (out_blocks if calls > out_blocks else 0)
        _, folds = folding(p, grid, split)
        if folds:
            tasks += folds - out_blocks  # the tree's folds are tasks (the caller charges their overhead)
            best -= folds * overhead
        return best, tasks


def _bytes(node) -> int:
    return math.prod(node.shape) * np.dtype(node.dtype).itemsize


def _distinct(held: list) -> int:
    """The bytes of ``(id, bytes)`` pairs, each id once (at its least)."""
    least: dict = {}
    for ident, b in held:
        least[ident] = min(least.get(ident, b), b)
    return sum(least.values())


def _made_by_maps(node) -> tuple:
    """``(id, bytes)`` of the least of ``node`` and the single-input maps of its
    shape it is made by (a join may apply them to their input inside its kernel,
    holding that instead: ``exp(x.astype(float64)) * y`` holds ``x``)."""
    least = node
    while isinstance(node, (Unary, ScalarOp)) and node.inputs[0].shape == node.shape:
        node = node.inputs[0]
        if _bytes(node) < _bytes(least):
            least = node
    return id(node), _bytes(least)
