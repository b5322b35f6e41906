"""Placements: which site holds which tuple (paper §4).

* :class:`All` — every tuple on every site (what a broadcast makes).
* :class:`Part` — partitioned on key dims ``dims``: a tuple's site is a function of
  its values on those dims alone.  The site function numbers the value combinations
  of ``dims`` in row-major order over their extents (the relation's frontier along
  ``dims``) and deals them round-robin to the sites.  So (i) two relations
  partitioned on dims whose values range alike put equal values on the same site
  (co-partitioning: what a local join needs), and (ii) value combinations, and so
  tuples, spread evenly: max − min tuples per site ≤ the tuples per combination.
* :class:`Grid` — key dims mapped onto the axes of a grid of sites (p×p×p for a 3-D
  multiply, 2×4, 8×1, …): each axis is driven by one key dim, blocked (value v of a
  dim with extent E sits at coordinate ⌊v·g/E⌋), or is a *spread* axis (None) whose
  coordinate is the sum of the key's driven values mod g; sites are numbered
  row-major over the grid.
* :class:`KeySites` — an explicit key → site map, for sources whose chunks already
  live somewhere.
* :class:`Assign` — partitioned on one key dim by an explicit value → site table
  (chosen where the data already is: :func:`affinity_table`).  Two relations assigned
  by the same table on dims whose values range alike are co-partitioned, like
  ``Part``.

>>> from tra_dask.types import grid_type
>>> t = grid_type((8, 6), (2, 2), "float64")          # keys (i, j), 4 x 3
>>> Part((1,), 2).sites(t).tolist()                    # site = j mod 2
[0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0]
>>> Part((0, 1), 5).sites(t).tolist()                  # site = (3 i + j) mod 5
[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..types import RelationType, flat_over, normalize_key
from .layout import _positions  # (sites of a large relation as its layout holds them)

__all__ = ["Placement", "All", "Part", "Grid", "KeySites", "Assign", "affinity_table", "blocked_table", "as_placement"]


def check_nsites(nsites) -> int:
    if isinstance(nsites, bool) or not isinstance(nsites, (int, np.integer)) or nsites < 1:
        raise ValueError(f"the number of sites must be an int >= 1, got {nsites!r}")
    return int(nsites)


class Placement:
    nsites: int

    @property
    def token(self):
        """A hashable value equal for equal placements (computed once: the planner
        compares source nodes, and so their placements, many thousand times)."""
        t = self.__dict__.get("_token")
        if t is None:
            t = (type(self).__name__,) + tuple(getattr(self, f) for f in self.__dataclass_fields__)
            object.__setattr__(self, "_token", t)
        return t


@dataclass(frozen=True)
class All(Placement):
    """Every tuple on every one of ``nsites`` sites."""

    nsites: int

    def __post_init__(self):
        object.__setattr__(self, "nsites", check_nsites(self.nsites))

    def __repr__(self):
        return "All"


@dataclass(frozen=True)
class Part(Placement):
    """Partitioned on the key dims ``dims`` over ``nsites`` sites (see module doc)."""

    dims: tuple
    nsites: int

    def __post_init__(self):
        object.__setattr__(self, "nsites", check_nsites(self.nsites))
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))

    def sites(self, t: RelationType) -> np.ndarray:
        """The site of every key of a relation of type ``t`` (aligned with t.keys)."""
        if self.dims and max(self.dims) >= t.arity:
            raise ValueError(
                f"{self!r}: key dim {max(self.dims)} does not exist in a relation of "
                f"key arity {t.arity}; valid key dims are 0..{t.arity - 1}"
            )
        return site_function(t, self.dims, self.nsites)

    def __repr__(self):
        return f"Part({', '.join(map(str, self.dims))})"


def site_function(t: RelationType, dims, nsites: int) -> np.ndarray:
    """Site of each key of ``t`` by its values on ``dims``: their row-major number
    over the frontier there, mod ``nsites`` (column by column; over the grid's axes
    for a grid whose keys are not made)."""
    n = t.ntuples
    if not len(dims) or n == 0:
        return np.zeros(n, dtype=np.int64)
    f = t.frontier
    lin = np.zeros((), dtype=np.int64)
    for d in dims:
        lin = lin * int(f[d]) + t.key_column(d)
    return flat_over((lin % nsites).astype(_positions(n), copy=False), f)


@dataclass(frozen=True)
class Grid(Placement):
    """Key dims on a grid of sites (see module doc).

    ``axes[a]`` is the key dim that drives grid axis ``a`` (blocked), or None for a
    spread axis; ``shape[a]`` is the axis' size; the grid is sites ``0 ..
    prod(shape) - 1`` of the ``nsites`` (a grid smaller than the cluster leaves the
    other sites idle: a key grid too small for every site).  Two relations gridded alike on dims of equal extents are
    co-partitioned; a spread axis puts the keys of one cell of the other axes on
    different layers of the grid (how a 3-D multiply's result is spread over the
    sites that hold its partial sums).

    >>> from tra_dask.types import grid_type
    >>> t = grid_type((4, 4), (1, 1), "float64")            # keys (i, j), 4 x 4
    >>> Grid((0, 1), (2, 2), 4).sites(t).reshape(4, 4).tolist()   # 2 x 2 blocks of sites
    [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    >>> Grid((0, None, 1), (2, 2, 1), 4).sites(t).reshape(4, 4).tolist()  # row blocks, (i + j) mod 2 layers
    [[0, 1, 0, 1], [1, 0, 1, 0], [2, 3, 2, 3], [3, 2, 3, 2]]
    """

    axes: tuple
    shape: tuple
    nsites: int

    def __post_init__(self):
        object.__setattr__(self, "nsites", check_nsites(self.nsites))
        object.__setattr__(self, "axes", tuple(None if a is None else int(a) for a in self.axes))
        object.__setattr__(self, "shape", tuple(int(g) for g in self.shape))
        if len(self.axes) != len(self.shape) or any(g < 1 for g in self.shape):
            raise ValueError(f"Grid: one size >= 1 per axis, got axes {self.axes} and shape {self.shape}")
        if int(np.prod(self.shape)) > self.nsites:
            raise ValueError(f"Grid: a {'x'.join(map(str, self.shape))} grid has {int(np.prod(self.shape))} "
                             f"sites, more than the {self.nsites} there are")
        driven = [a for a in self.axes if a is not None]
        if len(set(driven)) != len(driven):
            raise ValueError(f"Grid: a key dim drives at most one axis, got axes {self.axes}")

    @property
    def dims(self) -> tuple:
        """The key dims that drive an axis."""
        return tuple(a for a in self.axes if a is not None)

    def sites(self, t: RelationType) -> np.ndarray:
        if self.dims and max(self.dims) >= t.arity:
            raise ValueError(
                f"{self!r}: key dim {max(self.dims)} does not exist in a relation of key arity {t.arity}; "
                f"valid key dims are 0..{t.arity - 1}"
            )
        return grid_sites(t, self.axes, self.shape)

    def __repr__(self):
        axes = ", ".join("*" if a is None else str(a) for a in self.axes)
        return f"Grid({axes} on {'x'.join(map(str, self.shape))})"


def grid_sites(t: RelationType, axes: tuple, shape: tuple) -> np.ndarray:
    """Site of each key of ``t`` on a grid (see :class:`Grid`).  Column by column and
    in place (the keys of a 3-D multiply are 10^7 rows); over the grid's axes, not its
    keys, for a grid whose keys are not made (:meth:`RelationType.key_column`)."""
    n = t.ntuples
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    extents = t.frontier
    driven = [a for a in axes if a is not None]
    spread = None  # the sum of the driven dims, made only for a spread axis
    site = None
    for a, g in zip(axes, shape):
        if a is None:
            if spread is None:
                spread = np.zeros((), np.int64)
                for d in driven:
                    spread = _add(spread, t.key_column(d))
            c = spread % g
        else:
            c = t.key_column(a).astype(np.int64) * g
            c //= int(extents[a])
        if site is None:
            site = c
        else:
            site *= g
            site = _add(site, c)
    if site is None or np.ndim(site) == 0:  # no axis driven by a dim: one site for every key
        return np.full(n, 0 if site is None else int(site), dtype=np.int64)
    return flat_over(np.asarray(site, _positions(n)), extents)


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b``, in ``a``'s memory when ``a`` has the shape of the sum."""
    if a.shape == np.broadcast_shapes(a.shape, b.shape):
        a += b
        return a
    return a + b


@dataclass(frozen=True)
class KeySites(Placement):
    """An explicit site for every key (``items`` sorted ``((key, site), ...)``)."""

    items: tuple
    nsites: int

    def __post_init__(self):
        object.__setattr__(self, "nsites", check_nsites(self.nsites))
        for key, site in self.items:
            if not 0 <= site < self.nsites:
                raise ValueError(f"KeySites: key {key} is placed on site {site}; valid sites are 0..{self.nsites - 1}")

    def sites(self, t: RelationType, label: str = "source") -> np.ndarray:
        lookup = dict(self.items)
        out = np.empty(t.ntuples, dtype=np.int64)
        for i, key in enumerate(t.key_list()):
            if key not in lookup:
                raise ValueError(f"placement of {label}: key {key} has no site; every key needs one")
            out[i] = lookup[key]
        extra = set(lookup) - set(t.key_list())
        if extra:
            raise ValueError(f"placement of {label}: keys {sorted(extra)[:4]} are not keys of {label}")
        return out

    def __repr__(self):
        return f"KeySites[{len(self.items)} keys]"


@dataclass(frozen=True)
class Assign(Placement):
    """Partitioned on key dim ``dim``: a tuple whose value on it is v sits on site
    ``table[v]``.

    >>> from tra_dask.types import grid_type
    >>> t = grid_type((8, 6), (2, 2), "float64")          # keys (i, j), 4 x 3
    >>> Assign(0, (1, 0, 0, 1), 2).sites(t).reshape(4, 3).tolist()
    [[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1]]
    """

    dim: int
    table: tuple
    nsites: int

    def __post_init__(self):
        object.__setattr__(self, "nsites", check_nsites(self.nsites))
        object.__setattr__(self, "dim", int(self.dim))
        object.__setattr__(self, "table", tuple(int(x) for x in self.table))
        if any(not 0 <= x < self.nsites for x in self.table):
            raise ValueError(f"Assign: table {self.table} names a site outside 0..{self.nsites - 1}")

    def sites(self, t: RelationType) -> np.ndarray:
        if self.dim >= t.arity:
            raise ValueError(f"{self!r}: key dim {self.dim} does not exist in a relation of key arity {t.arity}; "
                             f"valid key dims are 0..{t.arity - 1}")
        if t.ntuples and t.frontier[self.dim] > len(self.table):
            raise ValueError(f"{self!r}: key dim {self.dim} has {t.frontier[self.dim]} values, the table "
                             f"{len(self.table)}")
        return np.asarray(self.table, dtype=np.int64)[t.keys[:, self.dim]] if t.ntuples else np.zeros(0, np.int64)

    def __repr__(self):
        if self.nsites <= 10 and len(self.table) <= 32:
            return f"Assign({self.dim} by {''.join(map(str, self.table))})"
        import hashlib

        return f"Assign({self.dim} by table {hashlib.sha1(repr(self.table).encode()).hexdigest()[:8]})"


def blocked_table(extent: int, nsites: int) -> tuple:
    """The blocked value → site table of one key dim (a 1-D :class:`Grid` axis):
    value v of ``extent`` on site ⌊v·s/extent⌋."""
    return tuple(int(x) for x in (np.arange(extent) * nsites) // extent)


def affinity_table(extent: int, nsites: int, held: list) -> tuple | None:
    """A value → site table for partitioning on one key dim that keeps data where it
    is: ``held`` is a list of (values, sites, elements) arrays — for each physical
    tuple of the relations to be partitioned, its value on the dim, its site and its
    elements.  Each value goes to the site holding most of its elements, no site
    taking more than ⌈extent / nsites⌉ values (balance: values, not elements);
    among equal holdings the blocked grid's site (``⌊v·s/extent⌋``) first, then the
    lower site; values held nowhere go to the blocked site while it has room, else the
    least loaded.  So with no preference the table is the blocked one.  Greedy,
    largest holdings first.  None when no tuple is held (nothing to keep in place)."""
    weight = np.zeros((extent, nsites))
    for values, sites, elements in held:
        np.add.at(weight, (np.asarray(values, np.int64), np.asarray(sites, np.int64)), np.asarray(elements, float))
    if not weight.any():
        return None
    blocked = np.array(blocked_table(extent, nsites), np.int64)
    cap = -(-extent // nsites)
    table = np.full(extent, -1, np.int64)
    load = np.zeros(nsites, np.int64)
    # largest holding first; at equal weight the blocked site first, then lower values
    v, s = np.nonzero(weight > 0)
    order = np.lexsort((v, s != blocked[v], -weight[v, s]))
    for i in order:
        vi, si = v[i], s[i]
        if table[vi] < 0 and load[si] < cap:
            table[vi] = si
            load[si] += 1
    for vi in np.flatnonzero(table < 0):  # held nowhere it could go: the blocked site, else the least loaded
        si = blocked[vi] if load[blocked[vi]] < cap else int(np.argmin(load))
        table[vi] = si
        load[si] += 1
    return tuple(int(x) for x in table)


def as_placement(spec, nsites: int) -> Placement:
    """A placement from ``All``/``Part``/``Grid``/``KeySites``/``Assign``, the strings ``"all"``, a tuple of
    dims (``Part``), or a dict ``{key: site}``."""
    if isinstance(spec, Placement):
        if spec.nsites != nsites:
            raise ValueError(f"placement {spec!r} is for {spec.nsites} sites, the plan has {nsites}")
        return spec
    if spec == "all":
        return All(nsites)
    if isinstance(spec, (tuple, list)):
        return Part(tuple(spec), nsites)
    if isinstance(spec, dict):
        return KeySites(tuple(sorted((normalize_key(k), int(v)) for k, v in spec.items())), nsites)
    raise TypeError(
        f"a placement is All(s), Part(dims, s), KeySites, 'all', a tuple of key dims, or a "
        f"dict {{key: site}}; got {spec!r}"
    )

