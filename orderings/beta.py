"""BETA (Marius, OSDI'21): the buffer sequence and its two bucket assignments.

The sequence, over partitions ``0..p-1`` (the registry relabels them at random
per epoch). Slots ``0..c-2`` are the *fixed* slots, slot ``c-1`` the *swap* slot.

* Start with ``[0, 1, ..., c-1]``; ``s`` is the partition in the swap slot.
* Repeat, with ``done`` the partitions already paired with every other one
  (initially none) and ``rest`` = all partitions not done, except ``s``:

  - if ``len(rest) <= c - 1``: put ``rest`` into the fixed slots (one swap per
    partition not already there) and stop: every remaining pair is now covered;
  - else the group ``G`` is the first ``c-1`` partitions of ``rest``: put ``G``
    into the fixed slots (one swap each, none in the first round where they are
    already there), then cycle the swap slot through the rest of ``rest``, one
    swap each, and mark ``G`` done. The last partition cycled stays as ``s``.

Round ``k >= 1`` costs ``(p-c) - (k-1)(c-1)`` swaps and round 0 costs ``p-c``,
so the total is ``(p-c) + (x+1)((p-c) - x(c-1)/2)`` with ``x = floor((p-c)/(c-1))``
(``bounds.beta_swap_count``); tests check this for every ``2 <= c <= p <= 32``.

Assignment: ``greedy`` puts each bucket in the first state that holds both its
partitions (as in the paper); ``random`` draws uniformly among those states.
"""

from __future__ import annotations

import numpy as np

from marius_py.orderings.ordering import Ordering, State, assign_buckets, check_sizes


def beta_states(num_partitions: int, capacity: int) -> tuple[State, ...]:
    """BETA's buffer states over partitions ``0..p-1`` (module docstring)."""
    p, c = num_partitions, capacity
    check_sizes(p, c)
    slots = list(range(c))
    states = [tuple(slots)]
    swap_slot, fixed_slots = c - 1, range(c - 1)

    def put(slot: int, partition: int) -> None:
        if slots[slot] != partition:
            slots[slot] = partition
            states.append(tuple(slots))

    done: set[int] = set()
    while True:
        s = slots[swap_slot]
        rest = [q for q in range(p) if q not in done and q != s]
        if len(rest) <= c - 1:
            for slot, q in zip(fixed_slots, rest):
                put(slot, q)
            return tuple(states)
        group = rest[:c - 1]
        for slot, q in zip(fixed_slots, group):
            put(slot, q)
        for q in rest[c - 1:]:
            put(swap_slot, q)
        done.update(group)


def build_beta(num_partitions: int, capacity: int, rng: np.random.Generator) -> Ordering:
    """BETA states, each bucket in the first state holding both partitions."""
    states = beta_states(num_partitions, capacity)
    return Ordering("beta", num_partitions, capacity, states, assign_buckets(states, num_partitions))


def build_beta_random(num_partitions: int, capacity: int, rng: np.random.Generator) -> Ordering:
    """BETA states, each bucket in a uniformly random state holding both partitions."""
    states = beta_states(num_partitions, capacity)
    return Ordering("beta_random", num_partitions, capacity, states,
                    assign_buckets(states, num_partitions, rng=rng))
