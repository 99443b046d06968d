"""A two-level randomised ordering in the spirit of MariusGNN's COMET (EuroSys'23).

The embedding store is cut into ``p * k`` small *physical* (storage) partitions
(``k = group_size``, default 4). Each epoch:

1. a random permutation of the physical partitions, drawn from the epoch's
   seed, is cut into ``p`` groups of ``k``: ``groups[l]`` is logical partition
   ``l`` (stored sorted);
2. the buffer walks BETA's state sequence over the ``p`` logical partitions
   (``beta.beta_states``); a logical slot holds the ``k`` physical partitions
   of its group;
3. each of the ``(p*k)^2`` *physical* buckets ``(a, b)`` is assigned to a state
   drawn uniformly among the states that hold both ``group_of(a)`` and
   ``group_of(b)``.

So one epoch differs from the next both in which nodes share a buffer slot and
in which state trains which edges, which is what breaks the correlation that a
fixed greedy ordering imposes on training (and costs it accuracy), at BETA's
swap count in logical partitions.

How a trainer uses it: open the edge store and embedding store with ``p * k``
partitions and a buffer of ``c * k`` physical slots, logical slot ``s`` being
physical slots ``s*k .. s*k+k-1``. At state 0 load ``groups[l]`` for every ``l``
in ``states[0]``; for every ``Swap(state, slot, evicted, admitted)`` write back
all of ``groups[evicted]`` and load all of ``groups[admitted]`` into that slot's
physical slots; in state ``t`` train the physical buckets ``buckets[t]`` (every
node they touch is resident: ``Ordering.resident(t)``).
"""

from __future__ import annotations

import numpy as np

from marius_py.orderings.beta import beta_states
from marius_py.orderings.ordering import Ordering, assign_buckets


def random_groups(num_groups: int, group_size: int, rng: np.random.Generator
                  ) -> tuple[tuple[int, ...], ...]:
    """Cut a random permutation of ``range(num_groups * group_size)`` into sorted groups."""
    perm = rng.permutation(num_groups * group_size)
    return tuple(tuple(sorted(int(q) for q in perm[g * group_size:(g + 1) * group_size]))
                 for g in range(num_groups))


def default_group_size(num_physical: int, capacity: int, largest: int = 8) -> int:
    """The group size k that training uses unless told: the largest k <= ``largest`` dividing both the
    physical partition count and the buffer's physical slots that leaves at least two groups in the
    buffer (BETA needs two logical slots); 1 (plain BETA over randomly relabelled partitions) if none."""
    return max((k for k in range(1, largest + 1)
                if num_physical % k == 0 and capacity % k == 0 and capacity // k >= 2), default=1)


def default_split(num_partitions: int, capacity: int, group_size: int = 8, most: int = 256) -> int:
    """Physical partitions each of ``num_partitions`` becomes under the default ordering: the smallest
    m <= ``group_size`` for which ``default_group_size(P m, C m)`` is ``group_size``, keeping P m <= ``most``.
    Measured (docs/design.md): regrouping 8 physical partitions per logical one keeps test MRR
    within 0.0034-0.0047 of in-memory training on CoDEx-M and 0.0092-0.0101 on FB15k-237, where groups of
    1-2 lost up to 0.024 and 0.016, at the same bytes read. 1 when
    the buffer holds every partition or no such m exists."""
    if capacity >= num_partitions:
        return 1
    return next((m for m in range(1, group_size + 1) if num_partitions * m <= max(most, num_partitions)
                 and default_group_size(num_partitions * m, capacity * m, group_size) == group_size), 1)


def build_comet(num_partitions: int, capacity: int, rng: np.random.Generator,
                group_size: int = 4) -> Ordering:
    """Two-level ordering: random groups of ``group_size`` physical partitions, BETA over groups."""
    if not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"comet: group_size must be an integer >= 1, got {group_size!r}")
    groups = random_groups(num_partitions, group_size, rng)
    labels = np.empty(num_partitions * group_size, dtype=np.int64)
    for lp, g in enumerate(groups):
        labels[list(g)] = lp
    states = beta_states(num_partitions, capacity)
    buckets = assign_buckets(states, num_partitions, rng=rng, labels=labels)
    return Ordering("comet", num_partitions, capacity, states, buckets, groups=groups)
