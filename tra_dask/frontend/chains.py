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
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from .chunking import _topo
from .einsum import symbol
from .nodes import Einsum

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

    new: dict = {}
    for n in order:
        ins = tuple(new[id(i)] for i in n.inputs)
        inline = [once(i) and i.dtype == n.dtype and len(set(s)) == len(s) for i, s in
                  zip(n.inputs, getattr(n, "subs", ()))] if isinstance(n, Einsum) and _plain(n) else []
        if any(inline):
            new[id(n)] = _merged(n, ins, inline)
        elif any(a is not b for a, b in zip(ins, n.inputs)):
            new[id(n)] = dataclasses.replace(n, inputs=ins)
        else:
            new[id(n)] = n
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
