"""Balanced bucket assignment: the same buffer states, each bucket moved to the eligible state that evens
out the edges trained per state.

An ordering assigns each bucket to one state holding both its partitions; BETA
picks the first such state. Its first state then trains every bucket among the
c partitions of the initial fill (c^2 of p^2 buckets: a quarter of the epoch at
c = p / 2) while the disk, with nothing evicted yet, reads only the next few
admissions, and the later states, one swap each, train little while the disk
reads and writes a partition. Moving buckets to other eligible states changes
no state, so no IO, and lets every state's training overlap its swap.

Buckets stay whole (every bucket still trains in one burst, which is what kept
accuracy in the ordering studies of docs/design.md); only which eligible state
trains it changes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from marius_py.orderings.ordering import Ordering, membership


def balanced_buckets(ordering: Ordering, bucket_edges: np.ndarray) -> Ordering:
    """``ordering`` with each bucket in the eligible state with the fewest edges so far.

    ``bucket_edges[i, j]``: edges of bucket ``(i, j)`` over storage partitions.
    Buckets with the fewest eligible states are placed first, the largest first
    among those (longest-processing-time greedy); ties go to the earliest state.
    """
    num_physical = ordering.num_physical_partitions
    resident = membership([ordering.resident(k) for k in range(ordering.num_states)], num_physical)
    buckets = [b for state_buckets in ordering.buckets for b in state_buckets]
    eligible = {b: np.flatnonzero(resident[:, b[0]] & resident[:, b[1]]) for b in buckets}
    load = np.zeros(ordering.num_states, dtype=np.int64)
    assigned: list[list[tuple[int, int]]] = [[] for _ in range(ordering.num_states)]
    for bucket in sorted(buckets, key=lambda b: (len(eligible[b]), -int(bucket_edges[b]), b)):
        states = eligible[bucket]
        state = int(states[np.argmin(load[states])])
        assigned[state].append(bucket)
        load[state] += int(bucket_edges[bucket])
    return replace(ordering, buckets=tuple(tuple(sorted(b)) for b in assigned))
