"""Communication lower bounds to measure plans against.

:func:`matmul_lower_bound` is the memory-independent bound for ``C = A·B`` on ``P``
processors of Al Daas, Ballard, Grigori, Kumar and Rouse ("Tight memory-independent
parallel matrix multiplication communication lower bounds", SPAA 2022), the bound
COSMA's grids attain: a processor that does its 1/P share of the ``m·k·n``
multiply-adds must access projections of sizes x, y, z of C, A and B with
``x·y·z ≥ (mkn/P)²`` (Loomis-Whitney), none larger than its matrix; the least
``x + y + z`` minus the 1/P share of the three matrices it may already own is what it
must receive.
"""

from __future__ import annotations

import math

__all__ = ["matmul_lower_bound"]


def matmul_lower_bound(m: int, k: int, n: int, P: int) -> float:
    """Words some processor must receive beyond what it owns (the bound above).

    >>> round(matmul_lower_bound(1000, 1000, 1000, 8))   # 3 (n³/8)^(2/3) - 3n²/8
    375000
    >>> matmul_lower_bound(10, 10, 10, 1)
    0.0
    """
    F = m * k * n / P
    sizes = sorted([m * n, m * k, k * n])  # C, A, B: the largest projection each can be
    total = None
    for fixed in range(3):  # the smallest `fixed` projections at their bounds, the rest equal
        rest = 3 - fixed
        prod_fixed = math.prod(sizes[:fixed])
        each = (F * F / prod_fixed) ** (1 / rest)
        if each <= sizes[fixed] or fixed == 2:
            total = sum(sizes[:fixed]) + rest * max(each, 0.0)
            break
    return max(0.0, total - sum(sizes) / P)
