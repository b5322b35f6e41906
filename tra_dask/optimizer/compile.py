"""TRA → IA: the paper's translation table (§5.1, Table "Translation from TRA to IA").

| TRA | IA |
|---|---|
| Σ(groupBy, aggOp)(R)          | LocalAggregate(groupBy, aggOp)(Shuffle(groupBy)(R)) |
| ⋈(keysL, keysR, projOp)(L, R)  | LocalJoin(keysL, keysR, projOp)(Broadcast(L), R) |
| rekey(keyFunc)(R)              | LocalMap(keyFunc, idOp)(R) |
| σ(boolFunc)(R)                 | LocalFilter(boolFunc)(R) |
| λ(transformFunc)(R)            | LocalMap(idOp, transformFunc)(R) |
| tile(dim, size)(R)             | LocalMap(keyTileOp, arrayTileOp)(R) |
| concat(keyDim, arrayDim)(R)    | LocalAggregate(⟨keyDim⟩ᶜ, arrayConcatOp)(Shuffle(⟨keyDim⟩ᶜ)(R)) |

One initial plan; shared subexpressions (structurally equal logical nodes) become one
physical node.  Sources get a placement: the caller's, or by default partitioned on
key dim 0 (free: an optimizer may choose another).
"""

from __future__ import annotations

from ..keys import identity
from ..logical import Aggregate, Concat, Filter, Join, Rekey, Relation, Source, Tile, Transform, flatten_outputs
from ..node import toposort
from ..physical import (Broadcast, ConcatAgg, KeyArrayMap, LocalAggregate, LocalFilter, LocalJoin, LocalMap, Part,
                        PSource, Shuffle, TileMap, as_placement)
from ..physical.placement import check_nsites
from .plan import COST_MODELS, Plan

__all__ = ["compile", "default_placement"]


def default_placement(source: Source, sites: int):
    """Partitioned on key dim 0 (everything on one site for a key of arity 0)."""
    return Part((0,) if source.key_arity else (), sites)


def compile(expr, sites: int, placements=None, cost_model: str = "exact") -> Plan:  # noqa: A001
    """The paper's initial IA plan for ``expr`` (a relation, or a tuple/dict of them)
    on ``sites`` sites.

    ``placements`` maps sources (the relation, or its name) to a placement: ``All``,
    ``Part(dims, sites)``, ``KeySites``, ``"all"``, a tuple of key dims, or
    ``{key: site}``.  A source given a placement here is *fixed* (its data is taken
    to be there already); the others get :func:`default_placement` and are *free*.
    """
    sites = check_nsites(sites)
    if cost_model not in COST_MODELS:
        raise ValueError(f"unknown cost_model {cost_model!r}; valid: {', '.join(COST_MODELS)}")
    outputs, rebuild = flatten_outputs(expr)
    order = toposort(outputs)
    chosen = _resolve_placements(placements, [n for n in order if isinstance(n, Source)], sites)
    memo: dict = {}
    for node in order:
        memo[node] = _translate(node, [memo[c] for c in node.children], chosen, sites)
    return Plan(tuple(memo[o] for o in outputs), rebuild, sites, cost_model, expr)


def _resolve_placements(placements, sources, sites):
    if placements is None:
        return {}
    if not isinstance(placements, dict):
        raise TypeError(f"placements must be a dict {{source or name: placement}}, got {type(placements).__name__}")
    by_name = {s.label: s for s in sources}
    out = {}
    for spec, p in placements.items():
        if isinstance(spec, Relation):
            if spec not in sources:
                raise ValueError(
                    f"placements names {spec.label}, which is not a source of this expression; its "
                    f"sources are {', '.join(sorted(by_name)) or 'none'}"
                )
            src = spec
        elif isinstance(spec, str):
            if spec not in by_name:
                raise ValueError(
                    f"placements names {spec!r}, which is not a source of this expression; its "
                    f"sources are {', '.join(sorted(by_name)) or 'none'}"
                )
            src = by_name[spec]
        else:
            raise TypeError(f"placements keys are sources or their names, got {spec!r}")
        out[src] = as_placement(p, sites)
    return out


def _translate(node, kids, chosen, sites):
    match node:
        case Source():
            if node in chosen:
                return PSource(node, chosen[node], free=False)
            return PSource(node, default_placement(node, sites), free=True)
        case Aggregate():
            return LocalAggregate(Shuffle(kids[0], node.group_by), node.group_by, node.kernel)
        case Join():
            return LocalJoin(Broadcast(kids[0]), kids[1], node.left_on, node.right_on, node.kernel)
        case Rekey():
            return LocalMap(kids[0], KeyArrayMap(node.key_fn, None))
        case Filter():
            return LocalFilter(kids[0], node.pred)
        case Transform():
            return LocalMap(kids[0], KeyArrayMap(identity(node.input.key_arity), node.kernel))
        case Tile():
            return LocalMap(kids[0], TileMap(node.tile_dim, node.tile_size))
        case Concat():
            rest = tuple(d for d in range(node.input.key_arity) if d != node.key_dim)
            return LocalAggregate(Shuffle(kids[0], rest), rest, ConcatAgg(node.key_dim, node.array_dim))
    raise TypeError(f"no IA translation for {type(node).__name__}")
