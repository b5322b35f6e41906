"""Chains of products (``a @ b @ c @ d``) merged into one einsum, whose contraction
order is then chosen like any einsum's.

``a @ b @ c`` builds ``(a @ b) @ c``: two-operand einsum nodes nested as written, an
order no one chose (a lopsided chain left to right can do a hundred times the flops
of its best order).  :func:`merge_chains` rewrites an einsum that reads another
einsum's result into one einsum of all their operands — the inner einsum's indices
renamed into the outer's (its output indices to the outer's subscript for it, its
summed ones to fresh indices) — so that the chunk choice ranks its contraction
orders (:mod:`.run`, opt_einsum's candidates by the estimate).

The law: ``sum_j (sum_k x·y)·z = sum_{j,k} x·y·z`` (a product distributes over a
sum), exact in exact arithmetic; in floating point the sums run in another order, as
numpy's ``einsum(optimize=True)`` runs them.  It is applied only where the result is
the same array of the same dtype:

* the inner einsum's result is read once, by that einsum, and is not an output (a
  result read twice is computed once, as written);
* both have the same dtype (an inner product in float32 read by a float64 one keeps
  its float32 rounding; bool einsums are left alone) and no operand broadcasts a
  size-1 axis;
* the outer einsum does not repeat an index over the inner's axes (a diagonal of a
  product);
* neither has an order or block sizes given by the user (``optimize=``, ``chunks=``).

A transposed operand (``a @ b.T``) is read as it is, its indices permuted: the same
products and sums (a transpose moves no number), so the contraction strategies see
the operand's own chunks — a transpose between a source and its join hid them
(``a @ b.T`` of 4096² on 64 sites was predicted 1.38 s on 4 of the sites, ``a @ b``
0.39 s).  An einsum read through transposes is inlined only if each is read once.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from .chunking import _topo
from .einsum import symbol
from .nodes import Einsum, Permute

__all__ = ["merge_chains"]


def merge_chains(roots: list) -> list:
    """``roots`` (array expression nodes) with every mergeable einsum read by an einsum
    merged into it (module doc), and the nodes above rebuilt; the same nodes when
    nothing merges."""
    order = _topo(roots)
    reads = Counter(id(i) for n in order for i in n.inputs)
    outputs = {id(r) for r in roots}

    def once(x) -> bool:
        return isinstance(x, Einsum) and reads[id(x)] == 1 and id(x) not in outputs and _plain(x)

    def alone(p) -> bool:  # a transpose read only here
        return reads[id(p)] == 1 and id(p) not in outputs

    new: dict = {}
    for n in order:
        key = id(n)
        ins = tuple(new[id(i)] for i in n.inputs)
        if isinstance(n, Einsum) and any(isinstance(i, Permute) for i in n.inputs):
            # a transposed operand read as it is, its indices permuted (the same products and sums)
            olds, subs, ins2, single = [], [], [], []
            for i, x, sub in zip(n.inputs, ins, n.subs):
                chain = True
                while isinstance(i, Permute):
                    chain = chain and alone(i)
                    sub = "".join(sub[i.perm.index(a)] for a in range(len(sub)))
                    i, x = i.inputs[0], x.inputs[0]
                olds.append(i)
                subs.append(sub)
                ins2.append(x)
                single.append(chain)
            n = dataclasses.replace(n, inputs=tuple(olds), subs=tuple(subs))
            ins = tuple(ins2)
        else:
            single = [True] * len(n.inputs)
        inline = [ok and once(i) and i.dtype == n.dtype and len(set(s)) == len(s) for i, s, ok in
                  zip(n.inputs, getattr(n, "subs", ()), single)] if isinstance(n, Einsum) and _plain(n) else []
        if any(inline):
            new[key] = _merged(n, ins, inline)
        elif any(a is not b for a, b in zip(ins, n.inputs)):
            new[key] = dataclasses.replace(n, inputs=ins)
        else:
            new[key] = n
    return [new[id(r)] for r in roots]


def _plain(e: Einsum) -> bool:
    """An einsum whose order and blocks are ours, over a numeric dtype, no operand
    broadcast."""
    return (e.optimize == "auto" and not e.chunks and e.dtype.kind in "iufc"
            and not any(e.broadcast_axes(i) for i in range(len(e.subs))))


def _merged(outer: Einsum, ins: tuple, inline: list) -> Einsum:
    """``outer`` over its (already merged) inputs ``ins``, those marked ``inline``
    (einsums) inlined: their operands join the outer's, their indices renamed."""
    sizes = dict(outer.sizes)
    used = set(sizes)
    fresh = (symbol(i) for i in range(10**9) if symbol(i) not in used)
    subs, ops = [], []
    for inner, sub, ok in zip(ins, outer.subs, inline):
        if not ok:
            subs.append(sub)
            ops.append(inner)
            continue
        rename = dict(zip(inner.out, sub))
        for c, n in inner.sizes:
            if c not in rename:
                rename[c] = next(fresh)
                used.add(rename[c])
            sizes[rename[c]] = n
        subs += ["".join(rename[c] for c in s) for s in inner.subs]
        ops += list(inner.inputs)
    return dataclasses.replace(outer, inputs=tuple(ops), subs=tuple(subs), sizes=tuple(sorted(sizes.items())))
