"""Communication lower bounds to measure plans against.

The memory-independent bound for ``C = A·B`` (``A`` m×k, ``B`` k×n) on ``P``
processors of Al Daas, Ballard, Grigori, Kumar and Rouse ("Tight memory-independent
parallel matrix multiplication communication lower bounds", SPAA 2022), and the same
argument for any two-operand einsum.

The argument.  Some processor performs at least ``F = mkn/P`` of the multiply-adds.
Let x, y, z be the elements of A, B and C it touches (the projections of its
multiply-adds ``(i, l, j)`` onto ``(i, l)``, ``(l, j)``, ``(i, j)``).  Then

* ``x·y·z ≥ F²`` (Loomis–Whitney),
* ``x ≤ mk``, ``y ≤ kn``, ``z ≤ mn`` (a projection is at most its matrix),
* it owns at most ``1/P`` of each matrix — ``mk/P``, ``kn/P``, ``mn/P`` elements: one
  copy of A and B is spread evenly at the start, one copy of C at the end.

Every touched element it does not own is a word it must receive (A, B) or send (a
partial sum of C), so it communicates at least the least ``Σ max(0, projection −
owned share)``, **per matrix**: A's words are not made fewer by owning more of C.
(Lowering a projection below its share saves nothing and only tightens the product,
so the minimum has every projection ≥ its share — each element of A takes part in
only n multiply-adds, so ``x ≥ F/n = mk/P`` anyway — and equals ``min(x + y + z) −
(mk + kn + mn)/P`` over projections ≥ their shares.)  The minimum is found by
water-filling: projections ``max(share, t)``, a common level ``t`` raised until the
product reaches ``F²``.  With the dimensions sorted ``d1 ≥ d2 ≥ d3`` (of m, k, n) the
shares are ``d1d2/P ≥ d1d3/P ≥ d2d3/P`` and there are three regimes:

1. ``P ≤ d1/d2`` (one large dim): the two larger matrices stay at their shares, the
   smallest is touched whole (``F²/(d1²d2d3/P²) = d2d3``):
   ``W = d2·d3 − d2·d3/P`` (a 1-D algorithm: the smallest matrix is replicated or
   reduced).
2. ``d1/d2 ≤ P ≤ d1d2/d3²`` (two large dims): the largest matrix stays at its share,
   the other two meet at ``t = d3·sqrt(d1d2/P)``:
   ``W = 2·sqrt(mkn·d3/P) − (d1d3 + d2d3)/P`` (a 2-D algorithm).
3. ``P ≥ d1d2/d3²`` (three large dims): all three at ``t = (mkn/P)^(2/3)``:
   ``W = 3·(mkn/P)^(2/3) − (mk + kn + mn)/P`` (a 3-D algorithm).

A plan's total floats moved counts each moved word once (an A or B word where it
arrives, a C partial where it leaves), so a plan whose sites each do ``1/P`` of the
multiply-adds, with one copy of each input and of the output, moves at least ``P·W``
in all (the per-site bound is convex in the owned shares: uneven ownership cannot
help the total).  :func:`plan_lower_bound` compares plans on that total / P.

Einsums (:func:`einsum_lower_bound`).  For ``A ⊗ B -> C`` whose indices each appear
in at least two of A, B, C, the Loomis–Whitney inequality still holds
(Bollobás–Thomason: every index is covered twice), so the same water-filling over
the three arrays' sizes with ``F = (product of all extents)/P`` gives the bound.
Grouping the indices — batch ``b`` (in A, B and C), ``m`` (A and C), ``n`` (B and
C), ``k`` (A and B, summed) — the arrays have ``bmk``, ``bkn``, ``bmn`` elements and
the work is ``bmkn``; with ``b = 1`` it is the matmul bound.
"""

from __future__ import annotations

import math
from ..logical import Join
from ..logical.evaluate import flatten_outputs
from ..node import toposort

__all__ = ["matmul_lower_bound", "matmul_regime", "einsum_lower_bound", "contraction_dims", "least_words", "plan_lower_bound"]


def least_words(sizes, work: float, P: int) -> float:
    """``min Σ max(0, xᵢ − sizesᵢ/P)`` over ``Π xᵢ ≥ (work/P)²`` and ``xᵢ ≤ sizesᵢ``:
    the words a processor doing ``work/P`` multiply-adds of a contraction between
    three arrays of ``sizes`` elements (two operands and the result), owning ``1/P``
    of each, must communicate (module doc).  Water-filling: ``xᵢ = clip(t, sizesᵢ/P,
    sizesᵢ)`` for the level ``t`` at which the product reaches ``(work/P)²``.

    >>> round(least_words([1000 * 1000] * 3, 1000 ** 3, 8))   # 3 (n³/8)^(2/3) - 3n²/8
    375000
    """
    if P < 1:
        raise ValueError(f"P must be >= 1, got {P!r}")
    sizes = [float(s) for s in sizes]
    if not sizes or min(sizes) <= 0 or work <= 0:
        return 0.0
    lo = [s / P for s in sizes]
    target = 2.0 * math.log(work / P)
    log_at = lambda t: sum(math.log(min(max(t, l), s)) for l, s in zip(lo, sizes))  # noqa: E731
    if log_at(min(lo)) >= target:  # the shares alone are enough: nothing need move
        return 0.0
    a, b = min(lo), max(sizes)
    for _ in range(200):  # bisect on the level (the product is monotone in it) ...
        mid = math.sqrt(a * b)
        a, b = (mid, b) if log_at(mid) < target else (a, mid)
    t = b
    # ... then solve exactly with the projections the level leaves free
    free = [i for i, (l, s) in enumerate(zip(lo, sizes)) if l < t < s]
    fixed = sum(math.log(min(max(t, lo[i]), sizes[i])) for i in range(len(sizes)) if i not in free)
    if free:
        t = math.exp((target - fixed) / len(free))
    return max(0.0, sum(min(max(t, l), s) - l for l, s in zip(lo, sizes)))


def matmul_lower_bound(m: int, k: int, n: int, P: int) -> float:
    """Words some processor must communicate beyond what it owns for ``C = A·B``,
    ``A`` m×k, ``B`` k×n, on ``P`` processors each doing ``1/P`` of the multiply-adds
    and owning ``1/P`` of each matrix (Al Daas et al. 2022; module doc).  With
    ``d1 ≥ d2 ≥ d3`` the sorted dims:

    * ``P ≤ d1/d2``:          ``d2·d3·(1 − 1/P)``
    * ``P ≤ d1·d2/d3²``:      ``2·sqrt(mkn·d3/P) − (d1·d3 + d2·d3)/P``
    * otherwise:              ``3·(mkn/P)^(2/3) − (mk + kn + mn)/P``

    >>> round(matmul_lower_bound(1000, 1000, 1000, 8))      # 3-D: 3 (n³/8)^(2/3) - 3n²/8
    375000
    >>> round(matmul_lower_bound(10000, 100, 10000, 8))     # 2-D: 2 sqrt(10^10·100/8) - 2·10^6/8
    457107
    >>> round(matmul_lower_bound(1000, 1000, 10, 4))        # 2-D: 2 sqrt(10^7·10/4) - 2·10^4/4
    5000
    >>> round(matmul_lower_bound(10, 100000, 10, 8))        # 1-D: reduce C, 100 (1 - 1/8)
    88
    >>> matmul_lower_bound(10, 10, 10, 1)
    0.0
    """
    if P < 1:
        raise ValueError(f"P must be >= 1, got {P!r}")
    d1, d2, d3 = sorted((m, k, n), reverse=True)
    if d3 <= 0:
        return 0.0
    if P <= d1 / d2:
        w = d2 * d3 - d2 * d3 / P
    elif P <= d1 * d2 / d3 ** 2:
        w = 2 * math.sqrt(m * k * n * d3 / P) - (d1 * d3 + d2 * d3) / P
    else:
        w = 3 * (m * k * n / P) ** (2 / 3) - (m * k + k * n + m * n) / P
    return max(0.0, w)


def matmul_regime(m: int, k: int, n: int, P: int) -> str:
    """Which case of :func:`matmul_lower_bound` applies: ``"1-D"`` (``P ≤ d1/d2``),
    ``"2-D"`` (``P ≤ d1·d2/d3²``) or ``"3-D"`` — the shape of grid that attains it.

    >>> matmul_regime(10000, 100, 10000, 8), matmul_regime(65536, 256, 256, 8), matmul_regime(64, 64, 64, 8)
    ('2-D', '1-D', '3-D')
    """
    d1, d2, d3 = sorted((m, k, n), reverse=True)
    return "1-D" if P <= d1 / d2 else "2-D" if P <= d1 * d2 / d3 ** 2 else "3-D"


def _parse(spec: str, nops: int = 2):
    spec = spec.replace(" ", "")
    if "." in spec:
        raise ValueError(f"einsum bound {spec!r}: ellipses are not supported (name the indices)")
    if "->" in spec:
        ins, out = spec.split("->")
    else:  # numpy's implicit output: the indices seen once, sorted
        ins = spec
        letters = spec.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    subs = ins.split(",")
    if len(subs) != nops:
        raise ValueError(f"einsum bound {spec!r}: expected {nops} operands, got {len(subs)}")
    return subs, out


def contraction_dims(spec: str, shape_a, shape_b) -> tuple:
    """``(b, m, k, n)`` for the two-operand einsum ``spec`` on arrays of these shapes:
    the products of the extents of the indices in A, B and the output (batch), in A
    and the output only (m), in A and B only (k, summed), in B and the output only
    (n).  ``ValueError`` for what the bound does not cover: an index repeated within
    an operand or the output, or one summed within a single operand.

    >>> contraction_dims("bij,bjk->bik", (4, 10, 20), (4, 20, 30))
    (4, 10, 20, 30)
    >>> contraction_dims("ij,ik->jk", (100, 7), (100, 9))   # A.T @ B
    (1, 7, 100, 9)
    """
    (xs, ys), out = _parse(spec)
    for s, shape, what in ((xs, shape_a, "A"), (ys, shape_b, "B")):
        if len(s) != len(shape):
            raise ValueError(f"einsum bound {spec!r}: operand {what} has {len(shape)} dims, subscripts {s!r}")
    for s in (xs, ys, out):
        if len(set(s)) != len(s):
            raise ValueError(f"einsum bound {spec!r}: repeated index in {s!r} (a diagonal) is not covered")
    ext: dict = {}
    for s, shape in ((xs, shape_a), (ys, shape_b)):
        for c, d in zip(s, shape):
            if ext.setdefault(c, int(d)) != int(d):
                raise ValueError(f"einsum bound {spec!r}: index {c!r} has extents {ext[c]} and {d}")
    if set(out) - set(ext):
        raise ValueError(f"einsum bound {spec!r}: output index not in the operands")
    b = m = k = n = 1
    for c, d in ext.items():
        where = (c in xs, c in ys, c in out)
        if where == (True, True, True):
            b *= d
        elif where == (True, False, True):
            m *= d
        elif where == (False, True, True):
            n *= d
        elif where == (True, True, False):
            k *= d
        else:
            raise ValueError(f"einsum bound {spec!r}: index {c!r} is summed within one operand (sum it first); "
                             f"the bound covers indices in at least two of A, B and the output")
    return b, m, k, n


def einsum_lower_bound(spec: str, shape_a, shape_b, P: int) -> float:
    """Words some processor must communicate beyond what it owns for the two-operand
    einsum ``spec`` (``"bij,bjk->bik"``) on ``P`` processors, each doing ``1/P`` of
    the multiply-adds and owning ``1/P`` of each operand and of the result: the
    matmul argument over the arrays' sizes ``bmk``, ``bkn``, ``bmn`` and the work
    ``bmkn`` (:func:`contraction_dims`; module doc).  For ``b = 1`` it is
    :func:`matmul_lower_bound` (m, k, n).

    >>> round(einsum_lower_bound("ij,jk->ik", (10000, 100), (100, 10000), 8))
    457107
    >>> round(einsum_lower_bound("bij,bjk->bik", (2, 1000, 1000), (2, 1000, 1000), 2))  # a batch each
    0
    >>> round(einsum_lower_bound("i,j->ij", (1000,), (1000,), 4))   # outer product: 2·sqrt(10^6/4) - 2·1000/4
    500
    """
    b, m, k, n = contraction_dims(spec, shape_a, shape_b)
    return least_words((b * m * k, b * k * n, b * m * n), b * m * k * n, P)


_MATMUL_SUBS = {"matmul": "ij,jk->ik", "matmul_tn": "ij,ik->jk", "matmul_nt": "ij,kj->ik"}


def _kernel_sub(kernel) -> str | None:
    """The einsum a two-operand join kernel computes on its chunks, or None."""
    name = getattr(kernel, "name", None)
    if name in _MATMUL_SUBS:
        return _MATMUL_SUBS[name]
    if name in ("tensordot", "einsum") and getattr(kernel, "arity", 0) == 2:
        params = getattr(kernel, "params", ())
        if params and isinstance(params[0], str) and "->" in params[0]:
            return params[0]
    return None


def _extents(t) -> tuple | None:
    """Per key dim ``d`` of a relation whose key dim ``d`` cuts array dim ``d``, the
    array's extent along it (the chunks' extents summed over the key's values)."""
    import numpy as np

    if t.arity != t.rank or not len(t.shapes):
        return None
    shapes = np.asarray(t.shapes, dtype=np.int64)[t.shape_ids]
    out = []
    for d in range(t.arity):
        _, first = np.unique(t.keys[:, d], return_index=True)
        out.append(int(shapes[first, d].sum()))
    return tuple(out)


def plan_lower_bound(plan) -> dict | None:
    """The communication lower bound for a plan whose expression is one two-operand
    contraction (one join, with a matmul or einsum kernel, over arrays cut along
    their key dims), as ``{"spec", "dims": (b, m, k, n), "per_site", "total",
    "moved", "ratio"}`` — the plan's floats moved over ``sites ×`` the per-site bound
    (a balanced plan cannot be under 1; module doc) — or None when the plan is
    something else (several contractions: a program has no bound here)."""
    if plan.expr is None:
        return None
    try:
        outs, _ = flatten_outputs(plan.expr)
    except TypeError:
        return None
    joins = [n for n in toposort(outs) if isinstance(n, Join)]
    if len(joins) != 1:
        return None
    j = joins[0]
    sub = _kernel_sub(j.kernel)
    if sub is None:
        return None
    (xs, ys), out = _parse(sub)
    ea, eb = _extents(j.left.type), _extents(j.right.type)
    if ea is None or eb is None or len(ea) != len(xs) or len(eb) != len(ys):
        return None
    if sorted(xs[d] for d in j.left_on) != sorted(c for c in set(xs) & set(ys)) or \
            [xs[d] for d in j.left_on] != [ys[d] for d in j.right_on]:
        return None  # a join whose keys do not pair the kernel's shared indices
    try:
        dims = contraction_dims(sub, ea, eb)
    except ValueError:
        return None
    P = plan.sites
    per_site = einsum_lower_bound(sub, ea, eb, P)
    moved = plan.cost.floats_moved
    total = per_site * P
    return {"spec": sub, "dims": dims, "per_site": per_site, "total": total, "moved": moved,
            "ratio": moved / total if total else (1.0 if moved == 0 else math.inf)}
