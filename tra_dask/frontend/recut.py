"""A re-cut: one axis of a chunk grid cut again, as TRA (paper §3), so the plan
places and costs it like any other work.

The relation of the axis's *pieces* (:class:`~tra_dask.logical.Pieces`, key ``(i, j, q)``:
the ``q``-th piece of output block ``j`` comes from input block ``i``; its geometry is
in its chunk's shape) is joined with the data on that block (the piece is cut out of its chunk: :func:`~.chunk_ops.piece_kernel`), rekeyed
so that ``j`` replaces ``i``, and concatenated along the axis in ``q`` order.  A
slice off the blocks' boundaries, a step, a reversal and a change of block size are
all this one expression; the pieces move where the plan puts each output block.

Law: the result is the grid of ``x[first::step][:length]`` along ``axis`` in blocks of
``out_block`` (the last smaller), every other axis as it was.
"""

from __future__ import annotations

import numpy as np

from .. import logical as L
from ..keys import Dim, key_map
from . import chunk_ops as ops

__all__ = ["recut", "regather", "rechunk", "aligned"]


def aligned(extent: int, block: int, first: int, step: int, length: int, out_block: int) -> bool:
    """Whether the re-cut keeps whole blocks (a filter and a rekey of the blocks
    do: step 1, ``first`` on a boundary, the same block size, and the last output
    block a whole input block or the input's last)."""
    if step != 1 or first % block or out_block != block:
        return False
    stop = first + length
    return stop % block == 0 or stop == extent


def recut(rel, axis: int, extent: int, block, first: int, step: int, length: int, out_block: int,
          name: str = ""):
    """``rel`` (a chunk grid; ``axis`` of ``extent`` in blocks of ``block``, or of the
    extents ``block`` lists) with that axis re-cut: elements ``first + o*step`` for ``o < length``, in blocks of
    ``out_block``."""
    src = L.Progression(int(first), int(step), int(length))  # (its pieces from the block boundaries alone)
    return regather(rel, axis, extent, block, src, out_block, step, f"{first}::{step} x{length}", name)


def regather(rel, axis: int, extent: int, block, src, out_block: int, step: int | None, what: str,
             name: str = ""):
    """``rel`` with ``axis`` re-cut in blocks of ``out_block``: output element ``o`` is
    input element ``src[o]`` (``step``: the stride of the runs to take as slices, None
    to take any run by its positions: :class:`~tra_dask.logical.Pieces`)."""
    if not isinstance(src, L.Progression):
        src = np.asarray(src, dtype=np.int64)
        src.flags.writeable = False
    pieces = L.Pieces(extent, block, src, out_block, step,
                      name=f"pieces[{name or rel.label} axis {axis}: {what}/{out_block}]")
    rank = rel.type.arity
    used = np.unique(pieces.table[:, 2])  # the input blocks the pieces come from: the others are not read
    if len(used) < (len(block) if isinstance(block, tuple) else -(-extent // block)):
        if used[-1] - used[0] + 1 == len(used):
            rel = L.filter(rel, (Dim(axis) >= int(used[0])) & (Dim(axis) <= int(used[-1])))
        else:
            rel = L.filter(rel, Dim(axis).isin(used.tolist()))
    cut = L.join(rel, pieces, (axis,), (0,), ops.piece_kernel(axis, step))  # key: rel's, j, q
    exprs = [Dim(rank) if d == axis else Dim(d) for d in range(rank)] + [Dim(rank + 1)]
    return L.concat(L.rekey(cut, key_map(tuple(exprs))), rank, axis)


def rechunk(rel, chunks: tuple, blocks: tuple, name: str = ""):
    """``rel``, a chunk grid in dask's ``chunks`` (each block's extent per axis), cut
    in blocks of ``blocks`` instead: each axis whose blocks differ re-cut in turn."""
    for a, (have, want) in enumerate(zip(chunks, blocks)):
        have = tuple(int(c) for c in have)
        n = sum(have)
        uniform = all(c == have[0] for c in have[:-1]) and 0 < have[-1] <= have[0]
        b = have[0] if uniform else None  # (else each block's extent: irregular, or with empty blocks)
        if b is not None and min(b, n) == min(want, n):
            continue
        rel = recut(rel, a, n, b if b is not None else have, 0, 1, n, want, name=name)
    return rel
