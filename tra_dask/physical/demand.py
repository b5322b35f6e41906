"""Demand: which physical tuples a plan actually needs.

A plan's results are one copy of each output key (the copy on the lowest site).
Walking back from them along each node's lineage marks every physical tuple that
contributes.  A broadcast copy that no local operator on its site reads is not
needed, and a runtime that is not wasteful never makes it: the lowering creates
tasks only for needed tuples, and the ``"exact"`` cost model counts only needed
moves — so prediction and measurement agree.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..node import toposort
from .layout import Layout, _first_copy
from .nodes import Broadcast, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PSource, Shuffle

__all__ = ["demand", "child_demand", "mask_digest", "result_copies"]


def result_copies(lay: Layout, nkeys: int) -> np.ndarray:
    """Index of the physical tuple that stands for each key of a result (lowest site)."""
    return _first_copy(lay, nkeys)


def demand(outputs, *, whole: bool = False, order: list | None = None, masks: dict | None = None) -> dict:
    """``{node: bool mask over node.layout's tuples}`` for every node of the plan.
    ``whole``: every tuple of the outputs is needed (a subplan whose consumer reads
    all it delivers), not one copy of each key.  ``masks``: ``{output: mask}``, the
    tuples needed of those outputs instead.  ``order``: ``toposort(outputs)``,
    when the caller has it already (the cost model does: sorting again is a tenth
    of costing a small plan)."""
    if order is None:
        order = toposort(outputs)
    need = {n: np.zeros(n.layout.ntuples, dtype=bool) for n in order}
    for o in outputs:
        if masks is not None and o in masks:
            need[o] |= masks[o]
        elif whole:
            need[o][:] = True
        else:
            need[o][result_copies(o.layout, o.type.ntuples)] = True
    for n in reversed(order):
        for c, rows in _made_from(n, need[n]):
            need[c][rows] = True
    return need


def child_demand(n, m: np.ndarray) -> list:
    """For each child of ``n``, the mask of its tuples that ``n``'s tuples ``m`` are
    made from (one step of :func:`demand` along ``n``'s lineage)."""
    out = []
    for c, rows in _made_from(n, m):
        mask = np.zeros(c.layout.ntuples, dtype=bool)
        mask[rows] = True
        out.append(mask)
    return out


def _made_from(n, m: np.ndarray) -> list:
    """``[(child, its tuples that n's tuples m are made from)]``: indices, or a mask
    (an aggregate's)."""
    if isinstance(n, PSource):
        return []
    lin = n.layout.lineage
    if isinstance(n, LocalAggregate):
        return [(n.input, m[lin[0]])]
    if isinstance(n, (Broadcast, Shuffle, LocalMap, LocalFilter)):
        return [(n.input, lin[0][m])]
    if isinstance(n, LocalJoin):
        return [(n.left, lin[0][m]), (n.right, lin[1][m])]
    raise TypeError(f"demand: unknown node {type(n).__name__}")


def mask_digest(mask: np.ndarray) -> bytes:
    """A 128-bit fingerprint of a demand mask (a key, not a copy: masks of big joins
    are tens of MB)."""
    return hashlib.blake2b(np.packbits(mask).tobytes() + len(mask).to_bytes(8, "little"), digest_size=16).digest()
