"""The planning context as data: :class:`Target` (what a plan runs on) and
:class:`SearchOptions` (how hard the optimizer looks), each one frozen value.

A :class:`Target` is everything :func:`tra_dask.optimize` needs to know about the
cluster: its number of sites, the :class:`~tra_dask.optimizer.cluster.ClusterSpec` the
time model prices plans on (None: the defaults for that many sites), the memory limit
per site (a hard constraint), the fixed placements of data already on the cluster
(sources, or their names, to placements) and the cost model that counts floats moved.
The runtime builds one per submission (:func:`tra_dask.runtime.submit.target_for`: the
only place that reads the workers' memory, calibrates and reads where data lives);
``td.optimize(expr, sites=..., memory_limit=...)`` builds one from its keywords.

Search options are named, as opt_einsum names its path options: :data:`SEARCH_OPTIONS`
maps ``"auto"`` (the default), ``"quick"`` (two placements per node: what the chunk
choice compares candidates with) and ``"full"`` (no sketch: a large expression searched
at full size, however long it takes) to their :class:`SearchOptions`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .cluster import ClusterSpec
from .cost import COST_MODELS
from .objective import parse_memory_limit
from ..physical.placement import check_nsites

__all__ = ["Target", "SearchOptions", "SEARCH_OPTIONS", "search_options"]


@dataclass(frozen=True)
class SearchOptions:
    """How the optimizer searches: ``beam`` placements kept per plan node, ``budget``
    rewrites tried before it stops early, ``sketch``: plan a large expression on a
    sketch of it (:mod:`.sketch`) and replay its best plans at full size; ``rounds``:
    how many times a node's new candidates are rewritten again (the closure under the
    rules, :mod:`.search`), and ``bound_rounds`` (None: ``rounds``) for a node whose
    candidates already hold more placement signatures than the beam keeps;
    ``least_traffic``: under an objective with an error band, each node also keeps its
    least-traffic candidate beyond the beam (what a near tie goes to:
    :func:`~tra_dask.optimizer.optimize.less_traffic`)."""

    name: str = "auto"
    beam: int = 6
    budget: int = 50_000
    sketch: bool = True
    rounds: int = 3
    bound_rounds: int | None = None
    least_traffic: bool = True

    def __post_init__(self):
        if not isinstance(self.least_traffic, bool):
            raise ValueError(f"search options {self.name!r}: least_traffic must be True or False, "
                             f"got {self.least_traffic!r}")
        for field in ("beam", "budget", "rounds", "bound_rounds"):
            v = getattr(self, field)
            if v is None and field == "bound_rounds":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"search options {self.name!r}: {field} must be an int >= 1, got {v!r}")
        if not isinstance(self.sketch, bool):
            raise ValueError(f"search options {self.name!r}: sketch must be True or False, got {self.sketch!r}")

    def replace(self, **changes) -> "SearchOptions":
        """These options with some fields changed (None values left as they are)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **changes) if changes else self


SEARCH_OPTIONS = {
    "auto": SearchOptions("auto"),
    # what frontend.run compares chunkings and contraction orders with: two placements per
    # node, two rounds of rewriting where the beam binds, no least-traffic candidate beyond
    # the beam (benchmarks/README.md, "Quick searches")
    "quick": SearchOptions("quick", beam=2, bound_rounds=2, least_traffic=False),
    # the plan frontend.run keeps: quick's beam and rounds, with each node's least-traffic
    # candidate (what the time band's near ties go to; benchmarks/README.md, "The plan kept")
    "narrow": SearchOptions("narrow", beam=2, bound_rounds=2),
    "full": SearchOptions("full", sketch=False),
}


def search_options(options) -> SearchOptions:
    """The :class:`SearchOptions` named by ``options`` (a key of :data:`SEARCH_OPTIONS`),
    or ``options`` itself."""
    if isinstance(options, SearchOptions):
        return options
    if isinstance(options, str) and options in SEARCH_OPTIONS:
        return SEARCH_OPTIONS[options]
    raise ValueError(f"unknown search options {options!r}; valid: {', '.join(map(repr, SEARCH_OPTIONS))} "
                     f"or a td.SearchOptions")


@dataclass(frozen=True)
class Target:
    """What a plan runs on (module doc).  ``placements`` is kept as a tuple of
    ``(source or name, placement)`` pairs (a frozen value); :attr:`placement_map`
    gives it back as the dict :func:`~tra_dask.optimizer.compile.compile` takes."""

    sites: int
    cluster: ClusterSpec | None = None
    memory_limit: float | None = None
    placements: tuple = ()
    cost_model: str = "exact"

    def __post_init__(self):
        object.__setattr__(self, "sites", check_nsites(self.sites))
        if self.cluster is not None:
            if not isinstance(self.cluster, ClusterSpec):
                raise TypeError(f"Target: cluster must be a td.ClusterSpec (see td.calibrate), got "
                                f"{type(self.cluster).__name__}")
            if self.cluster.sites != self.sites:
                object.__setattr__(self, "cluster", self.cluster.with_sites(self.sites))
        object.__setattr__(self, "memory_limit", parse_memory_limit(self.memory_limit))
        if self.cost_model not in COST_MODELS:
            raise ValueError(f"unknown cost_model {self.cost_model!r}; valid: {', '.join(COST_MODELS)}")
        p = self.placements
        if p is None:
            p = ()
        elif isinstance(p, dict):
            p = tuple(p.items())
        elif not isinstance(p, tuple):
            raise TypeError(f"placements must be a dict {{source or name: placement}}, got {type(p).__name__}")
        object.__setattr__(self, "placements", p)

    @property
    def placement_map(self) -> dict | None:
        return dict(self.placements) if self.placements else None

    def replace(self, **changes) -> "Target":
        return dataclasses.replace(self, **changes)
