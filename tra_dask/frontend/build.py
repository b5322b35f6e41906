"""From an array expression and a block size per axis to a TRA relation.

Every relation made here is a chunk grid: key dim ``d`` is the block index along
array axis ``d`` and the chunk holds that block (smaller at the edge), so the
result assembles with :func:`tra_dask.to_numpy` and maps onto a dask array's
blocks.  The translation is the paper's (§3): a contraction is a join on the shared
indices' key dims with a chunk kernel, then an aggregation over the summed indices'
key dims; a repeated index is a filter on equal key dims; broadcasting joins on the
axes both operands carry; a reduction aggregates over the reduced key dims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import logical as L
from ..keys import Const, Dim, key_map, project
from . import chunk_ops as ops
from .nodes import (ArgReduce, Concatenate, Cumsum, Einsum, Elementwise, Expand, Gather, Leaf, Regrid, Permute, Reduce, Reshape, ScalarOp,
                    Slice, Take, Unary, Where)
from .einsum import contraction_paths
from .recut import aligned, recut, regather
from ..kernels import scale

__all__ = ["Builder"]

_REGISTERED = {"add", "sub", "mul", "div", "max", "min"}
# contraction patterns (letters renamed in order of first appearance) the paper's kernels run
_MATMUL = {("ij", "jk", "ik"): "matmul", ("ij", "ik", "jk"): "matmul_tn", ("ij", "kj", "ik"): "matmul_nt"}
_FOLD = {"sum": "add", "max": "max", "min": "min", "prod": "mul", "any": "max", "all": "min"}  # (bools: or, and)


def _canon(xs: str, ys: str, out: str):
    """Rename letters to a canonical alphabet, in order of first appearance."""
    m: dict = {}
    for c in xs + ys + out:
        m.setdefault(c, "ijklmnop"[len(m)] if len(m) < 8 else c)
    return tuple("".join(m[c] for c in s) for s in (xs, ys, out))


def _rekey(rel, exprs):
    """``rekey`` unless the map is the identity."""
    exprs = tuple(exprs)
    if all(isinstance(e, Dim) and e.i == d for d, e in enumerate(exprs)) and len(exprs) == rel.type.arity:
        return rel
    return L.rekey(rel, key_map(exprs))


@dataclass(frozen=True, eq=False)
class RegionChunks:
    """The chunk loader of a :func:`~tra_dask.frontend.array.from_region` array cut in
    blocks of ``chunks``: the chunk under key ``k`` is ``fn`` of its region, checked
    to have the region's shape and a dtype that casts to ``dtype`` without losing its
    kind (floats do not become ints; a function that returns something else is an
    error naming the region, not a wrong result), and cast to ``dtype``.  Equal when
    their functions are equal (two equal loaders are one source)."""

    fn: object
    shape: tuple
    chunks: tuple
    dtype: object

    def __call__(self, key):
        region = tuple(slice(k * c, min((k + 1) * c, n)) for k, c, n in zip(key, self.chunks, self.shape))
        out = self.fn(region)
        if not (hasattr(out, "shape") and hasattr(out, "astype")):  # (a cupy array stays one)
            out = np.asarray(out)
        want = tuple(r.stop - r.start for r in region)

        def where():  # (formatted only for an error: a chunk is loaded on the hot path)
            return (f"from_region: {self.fn!r} returned {out.dtype} of shape {tuple(out.shape)} for the region "
                    f"{[(r.start, r.stop) for r in region]}")
        if tuple(out.shape) != want:
            raise ValueError(f"{where()}, which has shape {want}")
        if not np.can_cast(out.dtype, self.dtype, casting="same_kind"):
            raise TypeError(f"{where()}; the array is {np.dtype(self.dtype)}, and {out.dtype} does not cast to it "
                            f"without changing kind")
        return out.astype(self.dtype, copy=False)

    def __eq__(self, other):
        return (type(other) is RegionChunks and (self.fn is other.fn or self.fn == other.fn)
                and self.shape == other.shape and self.chunks == other.chunks and self.dtype == other.dtype)

    def __hash__(self):
        try:
            f = hash(self.fn)
        except TypeError:
            f = id(self.fn)
        return hash((f, self.shape, self.chunks, str(self.dtype)))


class Builder:
    """Translate nodes to relations under ``block(node, axis)``; each node once.

    ``dask_source(array, chunks)`` makes the relation of a dask array cut into
    ``chunks`` (given by the runtime: its blocks where they live, re-cut inside the
    plan, :func:`~.recut.rechunk`; or, with no cluster, the array computed here)."""

    def __init__(self, block, dask_source=None, paths=None):
        self.block = block
        self.dask_source = dask_source or _local_dask_source
        self.paths = paths or {}  # Einsum node -> contraction path
        self.memo: dict = {}

    def __call__(self, node):
        r = self.memo.get(node)
        if r is None:
            r = getattr(self, "_" + type(node).__name__.lower())(node)
            got = r.type
            if got.arity != node.ndim or got.rank != node.ndim:  # pragma: no cover - an internal bug
                raise AssertionError(f"front-end built {r.label} with arity {got.arity} for {node}")
            self.memo[node] = r
        return r

    def chunks(self, node) -> tuple:
        return tuple(self.block(node, a) for a in range(node.ndim))

    # -- leaves -------------------------------------------------------------
    def _leaf(self, node: Leaf):
        chunks = self.chunks(node)
        if node.kind == "relation":
            return node.data
        if node.kind == "dask":
            return self.dask_source(node.data, chunks, node.name)
        if node.kind == "function":
            return L.from_function(RegionChunks(node.data, node.shape, chunks, node.dtype), node.shape,
                                   chunks if node.ndim else (), node.dtype, name=node.name)
        return L.from_numpy(node.data, chunks if node.ndim else (), name=node.name)

    # -- einsum -------------------------------------------------------------
    def _operand(self, node: Einsum, i: int):
        """Operand ``i`` with its broadcast axes squeezed, repeated letters reduced
        to their diagonal, and letters no one else needs summed away."""
        rel, sub = self(node.inputs[i]), node.subs[i]
        bc = node.broadcast_axes(i)
        if bc:
            keep = [a for a in range(len(sub)) if a not in bc]
            rel = L.rekey(L.transform(rel, ops.squeeze_kernel(bc)), project(*keep))
            sub = "".join(sub[a] for a in keep)
        dup = [c for c in dict.fromkeys(sub) if sub.count(c) > 1]
        if dup:
            first = {c: sub.index(c) for c in dict.fromkeys(sub)}
            pred = None
            for a, c in enumerate(sub):
                if first[c] != a:
                    eq = Dim(first[c]) == Dim(a)
                    pred = eq if pred is None else pred & eq
            rel = L.filter(rel, pred)
            uniq = "".join(dict.fromkeys(sub))
            rel = L.rekey(L.transform(rel, ops.einsum_kernel(f"{sub}->{uniq}")), project(*first.values()))
            sub = uniq
        others = set(node.out).union(*(set(s) for j, s in enumerate(node.subs) if j != i))
        lonely = [c for c in sub if c not in others]
        if lonely and len(node.subs) > 1:
            kept = "".join(c for c in sub if c in others)
            rel = L.aggregate(L.transform(rel, ops.einsum_kernel(f"{sub}->{kept}", self._dtype(node, rel))),
                              tuple(sub.index(c) for c in kept), "add")
            sub = kept
        return rel, sub

    @staticmethod
    def _dtype(node: Einsum, *rels):
        """The dtype this einsum's partial sums run in: None (the kernels' own
        promotion) when every input already has the result's dtype."""
        if all(r.type.dtype == node.dtype for r in rels):
            return None
        return np.dtype(node.dtype).str

    def _einsum(self, node: Einsum):
        terms = [self._operand(node, i) for i in range(len(node.subs))]
        if len(terms) == 1:
            return self._unary_einsum(*terms[0], node.out, self._dtype(node, terms[0][0]))
        path = self.paths.get(node)
        if path is None and isinstance(node.optimize, tuple):  # a path given (checked by einsum)
            path = node.optimize
        if path is None:
            path = contraction_paths([s for _, s in terms], node.out, dict(node.sizes))[0]
        for step in path:  # opt_einsum's format: the operands at these positions go, their result goes last
            rest = [t for n, t in enumerate(terms) if n not in step]
            terms = rest + [self._step(node, [terms[n] for n in sorted(step)], rest)]
        (rel, sub), = terms
        return self._unary_einsum(rel, sub, node.out, self._dtype(node, rel))

    def _step(self, node: Einsum, group: list, rest: list):
        """One step of a path: one operand reduced to the indices still needed (a sum,
        a transpose; ``dp`` makes such steps), or two or more contracted pairwise,
        left to right.  The last step of all gives the output's indices in order."""
        need = set(node.out).union(*(set(s) for _, s in rest))
        (x, xs), more = group[0], group[1:]
        if not more:
            keep = node.out if not rest else "".join(c for c in dict.fromkeys(xs) if c in need)
            return self._unary_einsum(x, xs, keep, self._dtype(node, x)), keep
        for k, (y, ys) in enumerate(more):
            later = need.union(*(set(s) for _, s in more[k + 1:]))
            if not rest and k == len(more) - 1:
                keep = node.out
            else:
                keep = "".join(c for c in dict.fromkeys(xs + ys) if c in later)
            x, xs = self._contract(x, xs, y, ys, keep, self._dtype(node, x, y)), keep
        return x, xs

    def _unary_einsum(self, rel, sub: str, out: str, dtype=None):
        if sub == out and dtype is None:
            return rel
        summed = [c for c in sub if c not in out]
        if summed:
            rel = L.transform(rel, ops.einsum_kernel(f"{sub}->{out}", dtype))
            return L.aggregate(rel, tuple(sub.index(c) for c in out), "add")
        perm = tuple(sub.index(c) for c in out)
        if dtype is not None:  # a cast (and a transpose: its key dims permuted too)
            return _rekey(L.transform(rel, ops.einsum_kernel(f"{sub}->{out}", dtype)), [Dim(p) for p in perm])
        return L.rekey(L.transform(rel, ops.permute_kernel(perm)), project(*perm))

    def _contract(self, x, xs: str, y, ys: str, out: str, dtype=None):
        shared = [c for c in xs if c in ys]
        rest_y = [c for c in ys if c not in shared]
        joined = xs + "".join(rest_y)
        name = _MATMUL.get(_canon(xs, ys, out)) if dtype is None else None
        kern = name or ops.einsum_kernel(f"{xs},{ys}->{out}", dtype)
        j = L.join(x, y, tuple(xs.index(c) for c in shared), tuple(ys.index(c) for c in shared), kern)
        if any(c not in out for c in joined):
            return L.aggregate(j, tuple(joined.index(c) for c in out), "add")
        return _rekey(j, [Dim(joined.index(c)) for c in out])

    # -- elementwise --------------------------------------------------------
    def _elementwise(self, node: Elementwise):
        a, b = (self(x) for x in node.inputs)
        ka, kb = node.kept(0), node.kept(1)
        full = list(range(node.ndim))
        if [o for _, o in ka] == full and [o for _, o in kb] == full and node.op in _REGISTERED:
            return L.join(a, b, tuple(full), tuple(full), node.op)
        a = self._squeeze(a, node.inputs[0], ka)
        b = self._squeeze(b, node.inputs[1], kb)
        pa, pb = [o for _, o in ka], [o for _, o in kb]
        shared = [o for o in pa if o in pb]
        rest_b = [o for o in pb if o not in shared]
        j = L.join(a, b, tuple(pa.index(o) for o in shared), tuple(pb.index(o) for o in shared),
                   ops.broadcast_kernel(node.op, tuple(pa), tuple(pb), node.ndim))
        exprs = []
        for o in full:
            if o in pa:
                exprs.append(Dim(pa.index(o)))
            elif o in pb:
                exprs.append(Dim(len(pa) + rest_b.index(o)))
            else:
                exprs.append(Const(0))
        return _rekey(j, exprs)

    def _squeeze(self, rel, x, kept):
        """Drop the broadcast (size-1) axes of input ``x``: key dims and chunk axes."""
        keep = [a for a, _ in kept]
        if len(keep) == x.ndim:
            return rel
        drop = tuple(a for a in range(x.ndim) if a not in keep)
        return L.rekey(L.transform(rel, ops.squeeze_kernel(drop)), project(*keep))

    def _scalarop(self, node: ScalarOp):
        x = self(node.inputs[0])
        if node.op == "mul" and not node.reflected and type(node.value) is float and x.type.dtype.kind == "f":
            if np.result_type(x.type.dtype, 1.0) == x.type.dtype:
                return L.transform(x, scale(node.value))
        return L.transform(x, ops.scalar_kernel(node.op, node.value, node.reflected))

    def _unary(self, node: Unary):
        if node.kernel == "astype":
            kernel = ops.astype_kernel(np.dtype(node.dtype).str)
        elif node.kernel in ops.UNARY_UFUNCS:
            kernel = ops.ufunc_kernel(node.kernel)
        else:
            kernel = node.kernel  # a registered kernel, with its laws
        return L.transform(self(node.inputs[0]), kernel)

    def _where(self, node: Where):
        """A three-way join as two: ``[x, cond]`` (joined on the axes both carry), then
        that with ``y``; the key dims placed as :meth:`_elementwise` places them."""
        c, x, y = (self(i) for i in node.inputs)
        kc, kx, ky = (node.kept(i) for i in range(3))
        c, x, y = (self._squeeze(r, node.inputs[i], k) for i, (r, k) in enumerate(zip((c, x, y), (kc, kx, ky))))
        pc, px, py = ([o for _, o in k] for k in (kc, kx, ky))
        dt = np.dtype(node.dtype).str
        shared = [o for o in pc if o in px]
        pu = pc + [o for o in px if o not in shared]  # the pair's key dims, as output axes
        pair = L.join(c, x, tuple(pc.index(o) for o in shared), tuple(px.index(o) for o in shared),
                      ops.where_pack_kernel(tuple(pc), tuple(px), node.ndim, dt))
        shared = [o for o in pu if o in py]
        rest_y = [o for o in py if o not in shared]
        j = L.join(pair, y, tuple(pu.index(o) for o in shared), tuple(py.index(o) for o in shared),
                   ops.where_pick_kernel(tuple(py), node.ndim, dt))
        exprs = [Dim(pu.index(o)) if o in pu else Dim(len(pu) + rest_y.index(o)) if o in py else Const(0)
                 for o in range(node.ndim)]
        return _rekey(j, exprs)

    # -- reductions ---------------------------------------------------------
    def _reduce(self, node: Reduce):
        x = node.inputs[0]
        rel = L.transform(self(x), ops.reduce_kernel(node.op, node.axes))  # (no axes: numpy's dtype rule)
        if node.axes:
            kept = [a for a in range(x.ndim) if a not in node.axes]
            rel = L.aggregate(rel, tuple(kept), _FOLD[node.op])
        if node.keepdims and node.axes:
            rel = L.transform(rel, ops.expand_kernel(node.axes, x.ndim))
            it = iter(range(x.ndim - len(node.axes)))
            rel = _rekey(rel, [Const(0) if a in node.axes else Dim(next(it)) for a in range(x.ndim)])
        return rel

    def _argreduce(self, node: ArgReduce):
        x = node.inputs[0]
        rel = self(x)
        n, blk = x.shape[node.axis], self.block(x, node.axis)
        idx = L.from_function(ops.block_arange(n, blk), (n,), (blk,), np.int64, name=f"arange[{n}/{blk}]")
        pairs = L.join(rel, idx, (node.axis,), (0,), ops.argpair_kernel(node.op, node.axis))
        kept = tuple(a for a in range(x.ndim) if a != node.axis)
        best = L.aggregate(pairs, kept, ops.pairfold_kernel(node.op))
        return L.transform(best, ops.take_index_kernel())

    # -- shape --------------------------------------------------------------
    def _permute(self, node: Permute):
        if node.perm == tuple(range(node.ndim)):
            return self(node.inputs[0])
        return L.rekey(L.transform(self(node.inputs[0]), ops.permute_kernel(node.perm)), project(*node.perm))

    def _slice(self, node: Slice):
        """Per axis: nothing (all of it); the chunk itself sliced (one block in, one
        out); a filter and a rekey of whole blocks (:func:`~.recut.aligned`); else a
        re-cut (:func:`~.recut.recut`), one axis after another."""
        x = node.inputs[0]
        rel = self(x)
        pred, exprs, inside, recuts = None, [], [], []
        for a, (start, step) in enumerate(node.bounds):
            n, length, blk, out = x.shape[a], node.shape[a], self.block(x, a), self.block(node, a)
            exprs.append(Dim(a))
            if (start, step, length) == (0, 1, n):
                continue
            if blk >= n and out >= length:  # one block in and out: slice the chunk itself
                inside.append((a, start, step, length))
            elif aligned(n, blk, start, step, length, out):
                lo, hi = start // blk, -(-(start + length) // blk)
                cond = (Dim(a) >= lo) & (Dim(a) < hi) if lo else (Dim(a) < hi)
                pred = cond if pred is None else pred & cond
                exprs[a] = Dim(a) - lo if lo else Dim(a)
            else:
                recuts.append((a, n, blk, start, step, length, out))
        if pred is not None:
            rel = L.filter(rel, pred)
        if inside:
            rel = L.transform(rel, ops.slice_kernel(tuple(inside)))
        rel = _rekey(rel, exprs)
        for a, *geometry in recuts:
            rel = recut(rel, a, *geometry, name=_name(x))
        return rel

    def _gather(self, node: Gather):
        x = node.inputs[0]
        a = node.axis
        return regather(self(x), a, x.shape[a], self.block(x, a), node.index.values, self.block(node, a), node.step,
                        repr(node.index), name=_name(x))

    def _regrid(self, node: Regrid):
        x = node.inputs[0]
        rel = self(x)
        for a in node.axes:
            n, blk, out = x.shape[a], self.block(x, a), self.block(node, a)
            if blk != out:
                rel = recut(rel, a, n, blk, 0, 1, n, out, name=_name(x))
        return rel

    def _expand(self, node: Expand):
        x = node.inputs[0]
        rel = L.transform(self(x), ops.expand_kernel(node.positions, node.ndim))
        it = iter(range(x.ndim))
        return _rekey(rel, [Const(0) if o in node.positions else Dim(next(it)) for o in range(node.ndim)])

    def _reshape(self, node: Reshape):
        """A re-tile of each chunk (:func:`~.chunk_ops.reshape_kernel`) and a rekey: a
        kept axis keeps its key dim; a merged group's output axis takes its first
        input axis's (each chunk, whole along the group's other axes, is a run of the
        output axis: blocks of that axis's block times their extents), then is re-cut
        to its own blocks where they differ (:func:`~.recut.recut`); a split group's
        axes, one block, are 0."""
        x = node.inputs[0]
        spec, exprs, runs = [None] * node.ndim, [None] * node.ndim, []
        for g in node.groups:
            ins, outs = g
            for o in outs:
                if node.kept(g):
                    spec[o], exprs[o] = ("axis", ins[0]), Dim(ins[0])
                elif node.merged(g):
                    spec[o], exprs[o] = ("merge", ins), Dim(ins[0])
                    runs.append((o, self.block(x, ins[0]) * math.prod(x.shape[a] for a in ins[1:])))
                else:
                    spec[o], exprs[o] = ("n", node.shape[o]), Const(0)
        rel = _rekey(L.transform(self(x), ops.reshape_kernel(tuple(spec))), exprs)
        for o, run in runs:
            n, out = node.shape[o], self.block(node, o)
            if not aligned(n, run, 0, 1, n, out):
                rel = recut(rel, o, n, run, 0, 1, n, out, name=_name(node))
        return rel

    def _concatenate(self, node: Concatenate):
        """Joined on every key dim (the concatenation axis is one block, key 0 in every
        input), the chunks put side by side; more than two inputs left to right."""
        rels = [self(i) for i in node.inputs]
        dims = tuple(range(node.ndim))
        out = rels[0]
        for r in rels[1:]:
            out = L.join(out, r, dims, dims, ops.concat_kernel(node.axis))
        if out.type.dtype != node.dtype:  # (one input, or promotion by the kernel is numpy's: a guard)
            out = L.transform(out, ops.astype_kernel(np.dtype(node.dtype).str))
        return out

    def _cumsum(self, node: Cumsum):
        """Running sums per chunk; the chunk totals (``T``, key ``k``) joined with
        themselves on every key dim but ``axis`` (key ``k`` + ``j``, the other block's
        index), filtered to ``j <= k[axis]`` and concatenated in ``j`` order: the totals
        up to and including each block, side by side; joined back, each chunk gets the
        sum of those before its own added (the first block, nothing: an inf or nan in a
        block's total reaches only the blocks after it, as numpy's running sum does —
        subtracting the block's own total from the sum of all of them made nan of it)."""
        x, a = node.inputs[0], node.axis
        dt = np.dtype(node.dtype).str
        rel = self(x)
        running = L.transform(rel, ops.cumsum_kernel(a, dt))
        if -(-x.shape[a] // self.block(x, a)) == 1:  # one block: nothing before it
            return running
        totals = L.transform(L.transform(rel, ops.reduce_kernel("sum", (a,))), ops.expand_kernel((a,), x.ndim))
        if np.dtype(totals.type.dtype) != np.dtype(dt):
            totals = L.transform(totals, ops.astype_kernel(dt))
        other = tuple(d for d in range(x.ndim) if d != a)
        pairs = L.join(totals, totals, other, other, ops.SECOND)  # key: T's key, then the other block's index
        upto = L.filter(pairs, Dim(x.ndim) <= Dim(a))
        prefix = L.concat(upto, x.ndim, a)
        dims = tuple(range(x.ndim))
        return L.join(running, prefix, dims, dims, ops.add_prefix_kernel(a))

    def _take(self, node: Take):
        x = node.inputs[0]
        blk = self.block(x, node.axis)
        rel = L.filter(self(x), Dim(node.axis) == node.index // blk)
        rel = L.transform(rel, ops.take_kernel(node.axis, node.index % blk))
        return L.rekey(rel, project(*(a for a in range(x.ndim) if a != node.axis)))


def _name(node) -> str:
    return getattr(node, "name", "") or type(node).__name__.lower()


def _local_dask_source(x, chunks, name):
    """No cluster: compute the dask array here and cut it like a numpy array."""
    return L.from_numpy(computed_here(x), chunks if x.ndim else (), name=name)


def computed_here(arr):
    """A dask array computed in this process: numpy, or cupy for cupy chunks
    (``numpy.asarray`` would refuse a cupy result)."""
    out = arr.compute(scheduler="threads")
    return out if hasattr(out, "shape") and hasattr(out, "dtype") else np.asarray(out)
