"""Node partitions: contiguous id ranges of (almost) equal size.

Preprocessing assigns node ids in random order, so contiguous ranges are random
partitions. Partition ``i`` holds ids ``[i * size, min((i + 1) * size, n))``.
"""

from __future__ import annotations

import numpy as np


def partition_size(num_nodes: int, num_partitions: int) -> int:
    """Rows per partition (the last one may be shorter)."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return max(1, -(-num_nodes // num_partitions))


def partitions_filled(num_nodes: int, num_partitions: int) -> int:
    """How many partitions of ``partition_size`` rows the nodes fill; below ``num_partitions``
    when the last ones would be empty (only with fewer than about p^2 nodes)."""
    return max(1, -(-num_nodes // partition_size(num_nodes, num_partitions)))


def most_partitions_filled(num_nodes: int, below: int) -> int:
    """The largest partition count under ``below`` whose partitions all hold nodes (what to suggest
    instead of a count that leaves some empty)."""
    return max((q for q in range(1, below) if partitions_filled(num_nodes, q) == q), default=1)


def partition_bounds(num_nodes: int, num_partitions: int, partition: int) -> tuple[int, int]:
    """Half-open id range ``[start, end)`` of one partition."""
    size = partition_size(num_nodes, num_partitions)
    start = min(partition * size, num_nodes)
    return start, min(start + size, num_nodes)


def partition_of(node_ids: np.ndarray, num_nodes: int, num_partitions: int) -> np.ndarray:
    """Partition index of every node id."""
    return np.asarray(node_ids) // partition_size(num_nodes, num_partitions)


def bucket_of(heads: np.ndarray, tails: np.ndarray, num_nodes: int,
              num_partitions: int) -> np.ndarray:
    """Edge bucket index ``i * p + j`` for source partition i, destination j."""
    p = num_partitions
    return partition_of(heads, num_nodes, p) * p + partition_of(tails, num_nodes, p)
