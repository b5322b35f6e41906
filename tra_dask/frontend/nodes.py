"""The array front-end's expression nodes: immutable, typed by shape and dtype
alone, and free of any chunking.

An array expression is a DAG of these nodes.  The chunking is chosen later (by
:mod:`.chunking`) per *axis class*: axes that must be cut alike (the same einsum
index in every operand, the aligned axes of an elementwise op, an axis and its
image under a transpose or reduction) share one block size.  ``links`` says which
axes of a node's inputs its output axes are tied to; :mod:`.build` turns a node
and a block size per axis into a TRA relation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ANode", "Leaf", "Einsum", "Elementwise", "ScalarOp", "Unary", "Reduce", "ArgReduce",
           "Permute", "Slice", "Gather", "Index", "Regrid", "Take", "Expand", "Reshape", "Concatenate", "Where", "Cumsum"]


def _same_axes(ndim: int) -> list:
    """Links of a node whose output axis ``a`` is its input's axis ``a``."""
    return [(0, a, a) for a in range(ndim)]


def _without(ndim_in: int, dropped) -> list:
    """Links of a node whose output keeps its input's axes but ``dropped``, in order."""
    kept = [a for a in range(ndim_in) if a not in dropped]
    return [(0, a, o) for o, a in enumerate(kept)]


@dataclass(frozen=True, eq=False)
class ANode:
    shape: tuple
    dtype: np.dtype

    inputs = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def links(self):
        """``[(input index, input axis, output axis)]``: axes cut alike."""
        return []

    def ties(self):
        """``[((input index, axis), (input index, axis))]``: input axes cut alike
        that no output axis carries (a contracted einsum index)."""
        return []

    def whole(self):
        """``[(input index or None for the output, axis)]``: axes the node needs in one
        block (a reshape's merged or split axes, a concatenation's axis)."""
        return []


def _kept(node, x) -> list:
    """``[(input axis, output axis)]`` of input ``x`` of a broadcasting node that are
    not broadcast (numpy's rules: aligned from the right)."""
    off = node.ndim - x.ndim
    return [(a, a + off) for a in range(x.ndim) if x.shape[a] == node.shape[a + off]]


@dataclass(frozen=True, eq=False)
class Leaf(ANode):
    """Data: a numpy/cupy array (chunks free or given), a dask array (its chunks,
    where it lives), a TRA relation of a chunk grid (its chunks), or a function of a
    region made on the workers (chunks free or given: ``from_region``)."""

    data: Any = None
    kind: str = "numpy"             # "numpy", "dask", "relation" or "function"
    chunks: tuple | None = None     # a block size per axis when fixed
    name: str = ""


@dataclass(frozen=True, eq=False)
class Einsum(ANode):
    """``numpy.einsum`` with parsed subscripts: one letter per operand axis, the
    output letters, each letter's extent."""

    inputs: tuple = ()
    subs: tuple = ()
    out: str = ""
    sizes: tuple = ()  # ((letter, extent), ...)
    chunks: tuple = ()  # ((letter, block size), ...) the user gave
    optimize: object = "auto"  # "auto", an opt_einsum strategy, or a path

    def size(self, c) -> int:
        return dict(self.sizes)[c]

    def broadcast_axes(self, i) -> tuple:
        """Axes of operand ``i`` of extent 1 that broadcast against a larger extent."""
        sizes = dict(self.sizes)
        return tuple(a for a, (c, n) in enumerate(zip(self.subs[i], self.inputs[i].shape))
                     if n == 1 and sizes[c] != 1)

    def _axes(self):
        for i, sub in enumerate(self.subs):
            bc = self.broadcast_axes(i)
            for a, c in enumerate(sub):
                if a not in bc:
                    yield i, a, c

    def links(self):
        return [(i, a, self.out.index(c)) for i, a, c in self._axes() if c in self.out]

    def ties(self):
        first: dict = {}
        out = []
        for i, a, c in self._axes():
            if c in self.out:
                continue
            if c in first:
                out.append((first[c], (i, a)))
            else:
                first[c] = (i, a)
        return out


@dataclass(frozen=True, eq=False)
class Elementwise(ANode):
    """A binary elementwise op (``add``, ``sub``, ``mul``, ``div``, ``max``,
    ``min``, ``pow``) with numpy broadcasting."""

    inputs: tuple = ()
    op: str = "add"

    def kept(self, i) -> list:
        """``[(input axis, output axis)]`` of input ``i`` that are not broadcast."""
        return _kept(self, self.inputs[i])

    def links(self):
        return [(i, a, o) for i in range(2) for a, o in self.kept(i)]


@dataclass(frozen=True, eq=False)
class ScalarOp(ANode):
    """``x op c`` or ``c op x`` with a scalar ``c``."""

    inputs: tuple = ()
    op: str = "add"
    value: Any = 0
    reflected: bool = False

    def links(self):
        return _same_axes(self.ndim)


@dataclass(frozen=True, eq=False)
class Unary(ANode):
    """A unary elementwise kernel: a registered one (``exp``, ``log``, ``relu``, ...),
    one of numpy's other unary ufuncs by name (``sin``, ``floor``, ``isnan``, ...:
    :data:`~.chunk_ops.UNARY_UFUNCS`), or ``astype`` (a cast to the node's dtype)."""

    inputs: tuple = ()
    kernel: str = "identity"

    def links(self):
        return _same_axes(self.ndim)


@dataclass(frozen=True, eq=False)
class Reduce(ANode):
    """``sum``/``max``/``min``/``prod``/``any``/``all`` over ``axes`` (``keepdims``:
    they stay, extent 1)."""

    inputs: tuple = ()
    op: str = "sum"
    axes: tuple = ()
    keepdims: bool = False

    def links(self):
        x = self.inputs[0]
        if self.keepdims:
            return [(0, a, a) for a in range(x.ndim) if a not in self.axes]
        return _without(x.ndim, self.axes)


@dataclass(frozen=True, eq=False)
class ArgReduce(ANode):
    """``argmin``/``argmax`` along one axis."""

    inputs: tuple = ()
    op: str = "min"
    axis: int = 0

    def links(self):
        return _without(self.inputs[0].ndim, (self.axis,))


@dataclass(frozen=True, eq=False)
class Permute(ANode):
    """``transpose(perm)``: output axis ``d`` is input axis ``perm[d]``."""

    inputs: tuple = ()
    perm: tuple = ()

    def links(self):
        return [(0, p, d) for d, p in enumerate(self.perm)]


@dataclass(frozen=True, eq=False)
class Slice(ANode):
    """``x[start:stop:step, ...]`` per axis: output element ``o`` along axis ``a`` is
    input element ``start + o*step`` (``bounds[a] == (start, step)``; the length is
    the output's extent).  Output and input axes are cut alike; where the slice does
    not keep whole blocks it is a re-cut (:mod:`.recut`) the plan costs."""

    inputs: tuple = ()
    bounds: tuple = ()  # ((start, step), ...) per axis

    def links(self):
        return _same_axes(self.ndim)


class Index:
    """An integer array (read-only) compared and printed by its digest: a
    :class:`Gather`'s positions, light in the chunk choice's structure key."""

    __slots__ = ("values", "digest")

    def __init__(self, values):
        values = np.array(values, dtype=np.int64).reshape(-1)
        values.flags.writeable = False
        self.values = values
        self.digest = hashlib.blake2b(values.tobytes(), digest_size=12).hexdigest()

    def __eq__(self, other):
        return isinstance(other, Index) and self.digest == other.digest

    def __hash__(self):
        return hash(self.digest)

    def __repr__(self):
        return f"Index[{len(self.values)}: {self.digest}]"


@dataclass(frozen=True, eq=False)
class Gather(ANode):
    """Along ``axis``, output element ``o`` is input element ``index.values[o]``
    (``take``, integer-array and boolean-mask indexing, ``roll``, ``repeat``, ``tile``):
    a re-cut (:func:`~.recut.regather`) with the axis cut alike in and out.  ``step``:
    the stride of the runs it takes as slices (a roll or a tile: 1), None to take
    elements by their positions."""

    inputs: tuple = ()
    axis: int = 0
    index: Index = None
    step: int | None = None

    def links(self):
        return _same_axes(self.ndim)


@dataclass(frozen=True, eq=False)
class Regrid(ANode):
    """``x`` with its chunking along ``axes`` its own (a class of its own, not
    ``x``'s): a re-cut (:func:`~.recut.recut`) where the two differ — what lets an
    operation that needs an axis whole take an input whose given chunks cut it."""

    inputs: tuple = ()
    axes: tuple = ()

    def links(self):
        return [(0, a, a) for a in range(self.ndim) if a not in self.axes]


@dataclass(frozen=True, eq=False)
class Take(ANode):
    """``x[..., i, ...]``: the integer ``index`` along ``axis`` (the axis goes)."""

    inputs: tuple = ()
    axis: int = 0
    index: int = 0

    def links(self):
        return _without(self.inputs[0].ndim, (self.axis,))


@dataclass(frozen=True, eq=False)
class Expand(ANode):
    """Axes of extent 1 inserted at output ``positions`` (``x[:, None]``,
    ``expand_dims``): the other output axes are the input's, in order."""

    inputs: tuple = ()
    positions: tuple = ()

    def links(self):
        kept = [o for o in range(self.ndim) if o not in self.positions]
        return [(0, a, o) for a, o in enumerate(kept)]


@dataclass(frozen=True, eq=False)
class Reshape(ANode):
    """``reshape`` in C order, as ``groups``: ``((input axes), (output axes))`` whose
    extents have one product, in order.  A group of one axis each side keeps its
    axis (cut as it is: a rekey); a group that merges input axes into one output axis
    keeps its first input axis cut and the others whole (each chunk reshaped on its
    own is a run of the output axis, which is then re-cut to its own blocks: a
    ``ravel`` of a large array need not be one block); the axes of a group that splits
    one axis are kept in one block."""

    inputs: tuple = ()
    groups: tuple = ()

    def kept(self, group) -> bool:
        (ins, outs) = group
        return len(ins) == 1 and len(outs) == 1

    def merged(self, group) -> bool:
        """Several input axes into one output axis."""
        (ins, outs) = group
        return len(ins) > 1 and len(outs) == 1

    def links(self):
        return [(0, g[0][0], g[1][0]) for g in self.groups if self.kept(g)]

    def whole(self):
        out = []
        for g in self.groups:
            if self.merged(g):
                out += [(0, a) for a in g[0][1:]]
            elif not self.kept(g):
                out += [(0, a) for a in g[0]] + [(None, o) for o in g[1]]
        return out


@dataclass(frozen=True, eq=False)
class Concatenate(ANode):
    """``numpy.concatenate(inputs, axis)``: the other axes cut alike, ``axis`` one
    block in every input and in the output (TRA has no union: the inputs' chunks are
    joined on their other key dims and put side by side)."""

    inputs: tuple = ()
    axis: int = 0

    def links(self):
        return [(i, a, a) for i in range(len(self.inputs)) for a in range(self.ndim) if a != self.axis]

    def whole(self):
        return [(i, self.axis) for i in range(len(self.inputs))] + [(None, self.axis)]


@dataclass(frozen=True, eq=False)
class Where(ANode):
    """``numpy.where(cond, x, y)`` with numpy broadcasting: a three-way join, as two
    joins (``[x, cond]`` stacked, then joined with ``y``)."""

    inputs: tuple = ()

    def kept(self, i) -> list:
        return _kept(self, self.inputs[i])

    def links(self):
        return [(i, a, o) for i in range(3) for a, o in self.kept(i)]


@dataclass(frozen=True, eq=False)
class Cumsum(ANode):
    """``numpy.cumsum`` along ``axis``: the running sum within each chunk plus the
    totals of the chunks before it (a join of the chunk totals with themselves on
    the other key dims, filtered to the blocks up to each one, aggregated)."""

    inputs: tuple = ()
    axis: int = 0

    def links(self):
        return [(0, a, a) for a in range(self.ndim)]
