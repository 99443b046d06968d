"""Swap counts: the lower bound for any ordering and BETA's exact count.

Both are in swaps per epoch (one swap = one partition admitted into the
buffer after the initial fill), for ``p`` partitions and buffer capacity ``c``.
"""

from __future__ import annotations

from marius_py.orderings.ordering import check_sizes


def swap_lower_bound(num_partitions: int, capacity: int) -> int:
    """``ceil((p(p-1)/2 - c(c-1)/2) / (c-1))``; 0 when ``c == p``.

    The initial buffer covers ``c(c-1)/2`` of the ``p(p-1)/2`` unordered pairs of
    distinct partitions; each swap admits one partition, which meets at most
    ``c-1`` others, so no ordering covers every pair with fewer swaps.
    """
    p, c = num_partitions, capacity
    check_sizes(p, c)
    if c == p:
        return 0
    numerator = p * (p - 1) - c * (c - 1)
    denominator = 2 * (c - 1)
    return -(-numerator // denominator)


def beta_swap_count(num_partitions: int, capacity: int) -> int:
    """BETA's swaps: ``(p-c) + (x+1)*((p-c) - x*(c-1)/2)``, ``x = floor((p-c)/(c-1))``.

    Exact in integers: ``x(x+1)`` is even. 0 when ``c == p``.
    """
    p, c = num_partitions, capacity
    check_sizes(p, c)
    if c == p:
        return 0
    x = (p - c) // (c - 1)
    return (p - c) + (x + 1) * (p - c) - (x + 1) * x * (c - 1) // 2
