"""Re-partition rules R2-1 … R2-7 (paper §5.2.1).  Top node only; each yields
equivalent nodes.  Where the paper's side condition is about an input being
"already partitioned", we check it exactly on the input's layout."""

from __future__ import annotations

from itertools import combinations
from typing import Iterator

from ...physical import Broadcast, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PNode, Shuffle
from ._util import attempt, broadcast, is_identity_map, move_like, shuffle

_MOVES = (Broadcast, Shuffle)


def _rebuild_move(move: PNode, inp: PNode) -> PNode:
    return Broadcast(inp) if isinstance(move, Broadcast) else Shuffle(inp, move.dims, move.grid, move.table)


def r2_1_last_move_wins(node: PNode) -> Iterator[PNode]:
    """R2-1. In a chain of broadcasts/shuffles only the last is needed:
    B(B(R)) ≡ B(R), S_d2(S_d1(R)) ≡ S_d2(R), and likewise S(B(R)), B(S(R))."""
    if isinstance(node, _MOVES) and isinstance(node.input, _MOVES):
        yield from attempt(lambda: _rebuild_move(node, node.input.input))


def r2_2_swap_move_and_filter(node: PNode) -> Iterator[PNode]:
    """R2-2. B(σ_p(R)) ≡ σ_p(B(R)) and S_d(σ_p(R)) ≡ σ_p(S_d(R)).  Both directions
    (filtering before the move sends fewer tuples)."""
    if isinstance(node, _MOVES) and isinstance(node.input, LocalFilter):
        f = node.input
        yield from attempt(lambda: LocalFilter(_rebuild_move(node, f.input), f.pred))
    if isinstance(node, LocalFilter) and isinstance(node.input, _MOVES):
        m = node.input
        yield from attempt(lambda: _rebuild_move(m, LocalFilter(m.input, node.pred)))


def r2_3_swap_move_and_map(node: PNode) -> Iterator[PNode]:
    """R2-3. B(map(f, g)(R)) ≡ map(f, g)(B(R)); S_d(map(id, g)(R)) ≡ map(id, g)(S_d(R))
    when the key function is the identity (a shuffle partitions by key).  Both
    directions."""
    if isinstance(node, Broadcast) and isinstance(node.input, LocalMap):
        m = node.input
        yield from attempt(lambda: LocalMap(broadcast(m.input), m.op))
    if isinstance(node, Shuffle) and isinstance(node.input, LocalMap) and is_identity_map(node.input):
        m = node.input
        yield from attempt(lambda: LocalMap(move_like(node, m.input), m.op))
    if isinstance(node, LocalMap) and isinstance(node.input, Broadcast):
        b = node.input
        yield from attempt(lambda: broadcast(LocalMap(b.input, node.op)))
    if isinstance(node, LocalMap) and isinstance(node.input, Shuffle) and is_identity_map(node):
        s = node.input
        yield from attempt(lambda: move_like(s, LocalMap(s.input, node.op)))


def r2_4_drop_shuffle_before_aggregate(node: PNode) -> Iterator[PNode]:
    """R2-4. Σ_gb(S_d(R)) ≡ Σ_gb(R) when R is already partitioned so that every group
    lies on one site (the paper: partDims ⊆ groupByKeys; we check the layout
    exactly, which also covers inputs placed by a join or a source)."""
    if isinstance(node, LocalAggregate) and isinstance(node.input, Shuffle):
        inner = node.input.input
        for cand in attempt(lambda: LocalAggregate(inner, node.group_by, node.kernel)):
            if not cand.layout.partial:
                yield cand


def r2_5_pre_aggregate(node: PNode) -> Iterator[PNode]:
    """R2-5. Σ_gb(S_d(R)) ≡ Σ_gb'(S_d'(Σ_gb(R))) when the aggregation kernel is
    associative and commutative and d ⊆ gb: each site folds what it holds, then only
    the partial results move (gb' = all dims of the aggregated key, d' = d's positions
    in gb).  The paper prints the condition as groupByKeys ⊂ partDims and keeps d after
    the inner aggregation, whose output no longer has those dims; this is the sound
    version (partial aggregation, as in CMM's final step)."""
    if not (isinstance(node, LocalAggregate) and isinstance(node.input, Shuffle)):
        return
    k = node.kernel
    if not (getattr(k, "associative", False) and getattr(k, "commutative", False)):
        return
    d, gb = node.input.dims, node.group_by
    if node.input.grid or node.input.table or not set(d) <= set(gb):  # (a gridded shuffle: the 3-D multiply pre-aggregates)
        return
    inner = node.input.input
    if isinstance(inner, LocalAggregate) and inner.kernel == k:
        return  # already pre-aggregated
    d2 = tuple(gb.index(x) for x in d)
    all_dims = tuple(range(len(gb)))
    yield from attempt(lambda: LocalAggregate(shuffle(LocalAggregate(inner, gb, k), d2), all_dims, k))


def _strip(node: PNode) -> PNode:
    return node.input if isinstance(node, _MOVES) else node


def r2_6_join_strategies(node: PNode) -> Iterator[PNode]:
    """R2-6. ⋈(B(L), R) ≡ ⋈(L, B(R)) ≡ ⋈(S_lo(L), S_ro(R)): broadcast either side,
    or co-partition both on the join keys.  We also co-partition on any non-empty
    subset of the paired join dims (tuples that join agree on all of them, so on any
    subset too).  A join of replicated relations (``insert_dim``: one tuple becomes
    several that share one array — the 3-D multiply's join) is left to the domain
    rule that made it, which chooses its grid of sites: broadcasting a replica moves
    exactly the arrays broadcasting what it replicates moves (a plan R2-3 and BMM
    reach) in a layout the replication factor larger, and co-partitioning replicas
    on a subset of their dims is a coarser grid than the rule already offers."""
    if not isinstance(node, LocalJoin) or node.key_fn is not None:
        return
    L, R = _strip(node.left), _strip(node.right)
    if _replicates(L) or _replicates(R):
        return
    lo, ro, k = node.left_on, node.right_on, node.kernel
    yield from attempt(lambda: LocalJoin(broadcast(L), R, lo, ro, k))
    yield from attempt(lambda: LocalJoin(L, broadcast(R), lo, ro, k))
    pairs = list(zip(lo, ro))
    # a dim of one value on both sides partitions nothing (Part's site function numbers
    # keys over the values' extents): subsets that differ only in such dims are one
    # placement, so only the dims that vary are combined (one pair when none does)
    varying = [(a, b) for a, b in pairs if L.type.frontier[a] > 1 or R.type.frontier[b] > 1]
    pairs = varying or pairs[:1]
    for n in range(len(pairs), 0, -1):
        for sub in combinations(pairs, n):
            dl, dr = tuple(a for a, _ in sub), tuple(b for _, b in sub)
            yield from attempt(lambda dl=dl, dr=dr: LocalJoin(shuffle(L, dl), shuffle(R, dr), lo, ro, k))


def _replicates(node: PNode) -> bool:
    return isinstance(node, LocalMap) and getattr(node.op, "key_fn", None) is not None and getattr(
        node.op.key_fn, "multiplicity", 1) > 1


def r2_7_drop_shuffle_after_join(node: PNode) -> Iterator[PNode]:
    """R2-7. S_d(⋈(S_lo(L), S_ro(R))) ≡ ⋈(S_lo(L), S_ro(R)) when the join's output is
    already partitioned as S_d would put it.  The paper's condition, d ⊆ joinKeysL,
    does not guarantee that (Part(0, 1) is not Part(0)); we check exactly that the
    shuffle would move nothing."""
    if isinstance(node, Shuffle) and isinstance(node.input, LocalJoin):
        if not node.layout.moved.any() and node.input.layout.single_copy():
            yield node.input


def drop_noop_move(node: PNode) -> Iterator[PNode]:
    """Enforcer elimination (not in the paper's table; an identity): a Shuffle whose
    input is already partitioned as it would partition it, or a Broadcast of a
    relation already on every site, is its input."""
    if isinstance(node, _MOVES) and not node.layout.moved.any():
        inp = node.input
        if isinstance(node, Broadcast) or (inp.layout.single_copy() and not inp.layout.partial):
            yield inp


RULES_R2 = (
    r2_1_last_move_wins,
    r2_2_swap_move_and_filter,
    r2_3_swap_move_and_map,
    r2_4_drop_shuffle_before_aggregate,
    r2_5_pre_aggregate,
    r2_6_join_strategies,
    r2_7_drop_shuffle_after_join,
    drop_noop_move,
)
