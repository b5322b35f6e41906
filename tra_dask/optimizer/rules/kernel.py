"""Kernel-function composition rules R1-1 … R1-7 (paper §5.2.1, Table "Simple
equivalence rules").  Each looks at the top node only and yields equivalent nodes.
Side conditions use kernel facts (``distributes_over``) and key-function facts
(identity, dims read); an opaque predicate or key function makes a rule not fire."""

from __future__ import annotations

from typing import Iterator

from ...kernels import KernelTypeError, compose, premap
from ...keys import And, KeyMap, identity
from ...physical import KeyArrayMap, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PNode
from ._util import attempt, dims_map, folds_equal_shapes, is_identity_map, join_pairs_equal_shapes
from ...types import ArrayType


def r1_1_merge_filters(node: PNode) -> Iterator[PNode]:
    """R1-1. σ_p1(σ_p2(R)) ≡ σ_{p1 ∧ p2}(R).  No side condition."""
    if isinstance(node, LocalFilter) and isinstance(node.input, LocalFilter):
        inner = node.input
        yield from attempt(lambda: LocalFilter(inner.input, And((inner.pred, node.pred))))


def r1_2_merge_maps(node: PNode) -> Iterator[PNode]:
    """R1-2. map(f1, g1)(map(f2, g2)(R)) ≡ map(f1∘f2, g1∘g2)(R), when both key
    functions have output arity one.  Fires for symbolic key maps only (their
    composition stays analysable)."""
    if not (isinstance(node, LocalMap) and isinstance(node.input, LocalMap)):
        return
    a, b = node.op, node.input.op
    if not (isinstance(a, KeyArrayMap) and isinstance(b, KeyArrayMap)):
        return
    if not (isinstance(a.key_fn, KeyMap) and isinstance(b.key_fn, KeyMap)):
        return
    key_fn = a.key_fn.compose(b.key_fn)
    if a.kernel is None or b.kernel is None:
        kernel = a.kernel or b.kernel
    else:
        kernel = compose(a.kernel, b.kernel)
    yield from attempt(lambda: LocalMap(node.input.input, KeyArrayMap(key_fn, kernel)))


def _takes_all(kernel, rtype) -> bool:
    """Whether the unary ``kernel`` types on every chunk shape of ``rtype``."""
    try:
        for shape in rtype.shapes:
            kernel.out_type(ArrayType(tuple(shape), rtype.dtype))
    except KernelTypeError:
        return False
    return True


def r1_3_swap_map_and_filter(node: PNode) -> Iterator[PNode]:
    """R1-3. map(id, g)(σ_p(R)) ≡ σ_p(map(id, g)(R)), when the map's key function
    is the identity.  Both directions."""
    if isinstance(node, LocalMap) and is_identity_map(node) and isinstance(node.input, LocalFilter):
        f = node.input
        # below the filter the kernel meets every chunk, not only the kept ones: it
        # must take them all (einsum 'ii->i' after k0 == k1 takes square chunks only)
        if node.op.kernel is None or _takes_all(node.op.kernel, f.input.type):
            yield from attempt(lambda: LocalFilter(LocalMap(f.input, node.op), f.pred))
    if isinstance(node, LocalFilter) and isinstance(node.input, LocalMap) and is_identity_map(node.input):
        m = node.input
        yield from attempt(lambda: LocalMap(LocalFilter(m.input, node.pred), m.op))


def r1_4_map_through_aggregate(node: PNode) -> Iterator[PNode]:
    """R1-4. map(id, g)(Σ_{gb, agg}(R)) ≡ Σ_{gb, agg}(map(id, g)(R)), when ``g``
    distributes over ``agg`` (g(agg(a, b)) = agg(g(a), g(b))) for the chunks every
    fold combines: proved by :meth:`Kernel.distributes` from the registered kernels'
    facts and, unless ``g`` is elementwise, from every group folding chunks of one
    shape.  Both directions.

    The paper's first form, Σ_{gb, g∘agg}, applies g at every fold step, which for
    groups of three or more is g(agg(g(agg(a, b)), c)) ≠ g(agg(agg(a, b), c)); we
    implement only the distributive form, which is sound (it is how ``row_sum`` moves
    below the aggregation in nearest neighbour)."""
    if (isinstance(node, LocalMap) and is_identity_map(node) and node.op.kernel is not None
            and isinstance(node.input, LocalAggregate)):
        agg = node.input
        if (getattr(agg.kernel, "arity", 0) == 2 and node.op.kernel.distributes(
                agg.kernel, equal_shapes=folds_equal_shapes(agg.input.type, agg.group_by, agg.type),
                dtypes=(agg.input.type.dtype,))):
            op = KeyArrayMap(identity(agg.input.type.arity), node.op.kernel)
            yield from attempt(lambda: LocalAggregate(LocalMap(agg.input, op), agg.group_by, agg.kernel))
    if (isinstance(node, LocalAggregate) and isinstance(node.input, LocalMap) and is_identity_map(node.input)
            and node.input.op.kernel is not None and getattr(node.kernel, "arity", 0) == 2
            and node.input.op.kernel.distributes(
                node.kernel, equal_shapes=folds_equal_shapes(node.input.input.type, node.group_by, node.type),
                dtypes=(node.input.input.type.dtype,))):
        m = node.input
        op = KeyArrayMap(identity(node.type.arity), m.op.kernel)
        yield from attempt(lambda: LocalMap(LocalAggregate(m.input, node.group_by, node.kernel), op))


def r1_5_push_filter_into_aggregate(node: PNode) -> Iterator[PNode]:
    """R1-5. σ_p(Σ_{gb, agg}(R)) ≡ Σ_{gb, agg}(σ_{p'}(R)), with p' = p reading key dim
    gb[i] wherever p reads output dim i.  A predicate on the aggregate's output reads
    only group-by keys, so it keeps or drops whole groups — the paper's side condition.
    (The paper prints the right side as Σ_{boolFunc(groupByKeys), aggOp}(R), which is no
    aggregation signature; pushing the filter below is the sound reading.)  Opaque
    predicates: does not fire."""
    if isinstance(node, LocalFilter) and isinstance(node.input, LocalAggregate) and node.pred.dims_read is not None:
        agg = node.input
        pred = node.pred.substitute(dims_map({i: d for i, d in enumerate(agg.group_by)}))
        yield from attempt(lambda: LocalAggregate(LocalFilter(agg.input, pred), agg.group_by, agg.kernel))


def r1_6_push_filter_into_join(node: PNode) -> Iterator[PNode]:
    """R1-6. σ_p(⋈(L, R)) ≡ ⋈(σ_p(L), σ_{p'}(R)) when p reads only joined key dims
    (p' reads right_on[i] where p reads left_on[i]).  Also the one-sided sound
    variants: p reading only left key dims goes to the left input; p reading only the
    right's appended dims goes to the right input.  Opaque predicates: does not fire."""
    if not (isinstance(node, LocalFilter) and isinstance(node.input, LocalJoin)) or node.pred.dims_read is None:
        return
    j = node.input
    if j.key_fn is not None:
        return
    reads, kl = node.pred.dims_read, j.left.type.arity
    rest = [d for d in range(j.right.type.arity) if d not in j.right_on]
    if reads <= set(j.left_on):
        to_right = node.pred.substitute(dims_map({a: b for a, b in zip(j.left_on, j.right_on)}))
        yield from attempt(lambda: LocalJoin(LocalFilter(j.left, node.pred), LocalFilter(j.right, to_right),
                                             j.left_on, j.right_on, j.kernel))
    elif reads and max(reads) < kl:
        yield from attempt(lambda: LocalJoin(LocalFilter(j.left, node.pred), j.right, j.left_on, j.right_on, j.kernel))
    elif reads and min(reads) >= kl:
        to_right = node.pred.substitute(dims_map({kl + i: d for i, d in enumerate(rest)}))
        yield from attempt(lambda: LocalJoin(j.left, LocalFilter(j.right, to_right), j.left_on, j.right_on, j.kernel))


def r1_7_merge_map_into_join(node: PNode) -> Iterator[PNode]:
    """R1-7. map(f, g)(⋈_{k}(L, R)) ≡ ⋈_{g∘k, keys f}(L, R) when f has output arity
    one: the join's kernel becomes g∘k and its output keys go through f.  And when g
    distributes over k: ⋈_{k∘(g×g)} — g applied to each input inside the join, as in
    the paper's diag(X+Y) derivation (``matAdd∘diag``) — only where the law is proved
    for the pairs the join meets (:meth:`Kernel.distributes`: equal chunk shapes in
    every pair, or an elementwise g).  (The paper writes the key
    part as keyMapFunc(joinKeysL); a key map changes the output key, not the join
    keys, so we carry it as the join's output key function.)  Symbolic key maps only."""
    if not (isinstance(node, LocalMap) and isinstance(node.input, LocalJoin) and isinstance(node.op, KeyArrayMap)):
        return
    j, op = node.input, node.op
    if not isinstance(op.key_fn, KeyMap):
        return
    if j.key_fn is not None and not isinstance(j.key_fn, KeyMap):
        return
    key_fn = op.key_fn if j.key_fn is None else op.key_fn.compose(j.key_fn)
    if op.key_fn.is_identity(j.type.arity) and j.key_fn is None:
        key_fn = None
    kernels = [j.kernel] if op.kernel is None else [compose(op.kernel, j.kernel)]
    if op.kernel is not None and op.kernel.distributes(j.kernel, equal_shapes=join_pairs_equal_shapes(j),
                                                        dtypes=(j.left.type.dtype, j.right.type.dtype)):
        kernels.append(premap(j.kernel, op.kernel))
    for k in kernels:
        yield from attempt(lambda k=k: LocalJoin(j.left, j.right, j.left_on, j.right_on, k, key_fn))


RULES_R1 = (
    r1_1_merge_filters,
    r1_2_merge_maps,
    r1_3_swap_map_and_filter,
    r1_4_map_through_aggregate,
    r1_5_push_filter_into_aggregate,
    r1_6_push_filter_into_join,
    r1_7_merge_map_into_join,
)
