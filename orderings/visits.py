"""Orderings defined by a bucket visit order, with furthest-future eviction.

``sequential``, ``hilbert`` and ``hilbert_symmetric`` first fix the order in
which the ``p x p`` buckets are trained, then derive the buffer states from it:

* the first state holds the first ``c`` distinct partitions met in visit order;
* for each bucket in turn, each partition it needs that is not in the buffer is
  admitted into the slot of the resident partition whose next use is furthest
  in the future (Belady's rule; never used again counts as infinitely far; ties
  go to the lowest slot; the bucket's other partition is never evicted). Each
  admission is one swap and makes a new state, so a bucket missing both its
  partitions leaves an intermediate state with no bucket of its own;
* the bucket is assigned to the state current after its admissions.

Visit orders:

``sequential``  row-major: ``(0,0), (0,1), ..., (0,p-1), (1,0), ...``.
``hilbert``     cells of the ``p x p`` grid sorted by their index on the Hilbert
                curve of the smallest ``2^m x 2^m`` grid containing it (row =
                source partition, column = destination).
``hilbert_symmetric``  Hilbert order, but on reaching ``(i, j)`` also visit
                ``(j, i)`` right after it (cells already visited are skipped).
"""

from __future__ import annotations

import numpy as np

from marius_py.orderings.ordering import Bucket, Ordering, State, check_sizes, group_by_state


def row_major_visits(num_partitions: int) -> list[Bucket]:
    p = num_partitions
    return [(i, j) for i in range(p) for j in range(p)]


def hilbert_index(order: int, x: int, y: int) -> int:
    """Position of cell ``(x, y)`` on the Hilbert curve filling a ``2^order`` square."""
    n = 1 << order
    d = 0
    s = n >> 1
    while s > 0:
        rx = 1 if x & s else 0
        ry = 1 if y & s else 0
        d += s * s * ((3 * rx) ^ ry)
        if ry == 0:                      # rotate the quadrant
            if rx == 1:
                x, y = n - 1 - x, n - 1 - y
            x, y = y, x
        s >>= 1
    return d


def hilbert_visits(num_partitions: int) -> list[Bucket]:
    p = num_partitions
    order = max(0, (p - 1).bit_length())
    return sorted(row_major_visits(p), key=lambda b: hilbert_index(order, b[0], b[1]))


def hilbert_symmetric_visits(num_partitions: int) -> list[Bucket]:
    seen: set[Bucket] = set()
    out: list[Bucket] = []
    for i, j in hilbert_visits(num_partitions):
        for b in ((i, j), (j, i)):
            if b not in seen:
                seen.add(b)
                out.append(b)
    return out


def furthest_future(visits: list[Bucket], num_partitions: int, capacity: int
                    ) -> tuple[tuple[State, ...], tuple[tuple[Bucket, ...], ...]]:
    """States and per-state buckets for ``visits`` under furthest-future eviction."""
    p, c = num_partitions, capacity
    check_sizes(p, c)
    never = len(visits)                 # "never used again": later than any visit
    # after_i[t] / after_j[t]: next visit after t using visits[t]'s head / tail
    after_i, after_j = [never] * len(visits), [never] * len(visits)
    next_use = [never] * p              # filled backwards, ends as each partition's first use
    for t in range(len(visits) - 1, -1, -1):
        i, j = visits[t]
        after_i[t], after_j[t] = next_use[i], next_use[j]
        next_use[i] = next_use[j] = t

    first_seen = list(dict.fromkeys(q for b in visits for q in b))
    seen = set(first_seen)
    first_seen += [q for q in range(p) if q not in seen]
    slots = first_seen[:c]
    resident = set(slots)
    states = [tuple(slots)]
    chosen = []
    for t, (i, j) in enumerate(visits):
        for q in (i, j):
            if q in resident:
                continue
            victim, victim_use = -1, -1
            for s in range(c):          # furthest next use; ties: lowest slot
                r = slots[s]
                if r != i and r != j and next_use[r] > victim_use:
                    victim, victim_use = s, next_use[r]
            resident.discard(slots[victim])
            slots[victim] = q
            resident.add(q)
            states.append(tuple(slots))
        next_use[i], next_use[j] = after_i[t], after_j[t]
        chosen.append(len(states) - 1)
    heads = np.array([b[0] for b in visits], dtype=np.int64)
    tails = np.array([b[1] for b in visits], dtype=np.int64)
    return tuple(states), group_by_state(np.array(chosen, dtype=np.int64), heads, tails, len(states))


def _build(name: str, visits: list[Bucket], num_partitions: int, capacity: int) -> Ordering:
    states, buckets = furthest_future(visits, num_partitions, capacity)
    return Ordering(name, num_partitions, capacity, states, buckets)


def build_sequential(num_partitions: int, capacity: int, rng: np.random.Generator) -> Ordering:
    """Row-major bucket order, furthest-future eviction."""
    return _build("sequential", row_major_visits(num_partitions), num_partitions, capacity)


def build_hilbert(num_partitions: int, capacity: int, rng: np.random.Generator) -> Ordering:
    """Hilbert-curve bucket order, furthest-future eviction."""
    return _build("hilbert", hilbert_visits(num_partitions), num_partitions, capacity)


def build_hilbert_symmetric(num_partitions: int, capacity: int, rng: np.random.Generator) -> Ordering:
    """Hilbert order visiting ``(i, j)`` and ``(j, i)`` together, furthest-future eviction."""
    return _build("hilbert_symmetric", hilbert_symmetric_visits(num_partitions), num_partitions, capacity)
