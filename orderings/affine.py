"""A two-level ordering whose buffer states are the lines of an affine plane.

Out of core, accuracy falls as each partition is trained in more buffer states
per epoch (docs/design.md): every such state gives its
nodes a biased share of their edges. BETA's sequence over logical partitions,
two of them in the buffer, trains each one in ``2 p / c - 1`` states; with a
quarter of the nodes resident that is 7.

Here the ``p = q^2`` logical partitions are the points of the affine plane over
GF(q) and the buffer holds ``c = q`` of them: a line. Every two points lie on
exactly one line, so the ``q (q + 1)`` lines hold every bucket once, and every
point lies on ``q + 1`` lines: a partition trains in ``q + 1`` states (5 at a
quarter, against BETA's 7), at about the same bytes read (consecutive lines meet
in one point, so ``q - 1`` slots change between them).

Logical partitions are random groups of ``group_size`` physical ones, redrawn
every epoch, as in ``comet``. Between two lines the slots change one at a time
(an ``Ordering`` changes one slot per state); only the lines' states train: a
bucket across two groups goes to the line through them, a bucket inside a group
to a random line through it.
"""

from __future__ import annotations

import numpy as np

from marius_py.orderings.comet import random_groups
from marius_py.orderings.ordering import Ordering, group_by_state

# Irreducible polynomials of GF(2^m), bit i the coefficient of x^i (x^m included).
_GF2_POLYNOMIALS = {4: 0b111, 8: 0b1011, 16: 0b10011}


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, int(q ** 0.5) + 1))


# Buffers (logical slots) the ordering is built for: GF(q) exists and is implemented here.
AFFINE_BUFFERS = tuple(q for q in range(2, 32) if _is_prime(q) or q in _GF2_POLYNOMIALS)


def affine_split(num_partitions: int, capacity: int, most: int = 256) -> int:
    """Physical partitions each of ``num_partitions`` becomes when ``affine`` picks its own store: 4 (groups of 4
    regrouped every epoch, as measured), or fewer past ``most`` partitions; 1 unless ``num_partitions`` is
    ``capacity^2`` (the layout affine needs) with ``capacity < num_partitions`` one of ``AFFINE_BUFFERS``."""
    if capacity == num_partitions or not affine_defined(num_partitions, capacity):
        return 1
    return next((m for m in (4, 2) if num_partitions * m <= most), 1)


def affine_group_size(num_physical: int, capacity: int) -> int:
    """The group size k making ``num_physical / k`` logical partitions the square of the ``capacity / k`` in
    the buffer: ``capacity^2 / num_physical`` (1 when that is not whole: the config refuses the layout)."""
    k, rest = divmod(capacity * capacity, num_physical)
    return k if k >= 1 and rest == 0 and capacity % k == 0 else 1


def affine_defined(num_partitions: int, capacity: int) -> bool:
    """Whether the ordering exists for these logical counts: p = c^2 with GF(c) implemented, or c = p."""
    return capacity == num_partitions or (num_partitions == capacity * capacity and capacity in AFFINE_BUFFERS)


def field_tables(q: int) -> tuple[np.ndarray, np.ndarray]:
    """Addition and multiplication tables of GF(q), q a prime or 4, 8 or 16 (elements 0..q-1)."""
    if _is_prime(q):
        values = np.arange(q)
        return (values[:, None] + values[None, :]) % q, (values[:, None] * values[None, :]) % q
    if q not in _GF2_POLYNOMIALS:
        raise ValueError(f"affine: a buffer of {q} logical partitions needs a prime or 4, 8 or 16")
    add = np.arange(q)[:, None] ^ np.arange(q)[None, :]
    mul = np.array([[_gf2_product(a, b, q) for b in range(q)] for a in range(q)], dtype=np.int64)
    return add, mul


def _gf2_product(a: int, b: int, q: int) -> int:
    """a * b in GF(q = 2^m): carry-less multiplication reduced by the field's polynomial."""
    product = 0
    while b:
        if b & 1:
            product ^= a
        b >>= 1
        a <<= 1
        if a & q:
            a ^= _GF2_POLYNOMIALS[q]
    return product


def affine_lines(q: int) -> list[list[tuple[int, ...]]]:
    """The plane's lines as point sets (point ``x q + y``), by parallel class: ``q`` slopes, then vertical."""
    add, mul = field_tables(q)
    classes = [[tuple(sorted(x * q + add[mul[m, x], b] for x in range(q))) for b in range(q)] for m in range(q)]
    classes.append([tuple(b * q + y for y in range(q)) for b in range(q)])
    return classes


def line_sequence(q: int) -> list[tuple[int, ...]]:
    """Every line once, consecutive lines from different classes (so they meet in one point)."""
    classes = affine_lines(q)
    return [classes[c][j] for j in range(q) for c in range(q + 1)]


def build_affine(num_partitions: int, capacity: int, rng: np.random.Generator, group_size: int = 4) -> Ordering:
    """States walking the lines of AG(2, q) (``num_partitions = q^2``, ``capacity = q``), over random groups."""
    if not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"affine: group_size must be an integer >= 1, got {group_size!r}")
    q = capacity
    if q == num_partitions:  # the buffer holds everything: one state, as every ordering
        groups = random_groups(num_partitions, group_size, rng)
        n = num_partitions * group_size
        heads, tails = np.divmod(np.arange(n * n), n)
        return Ordering("affine", num_partitions, capacity, (tuple(range(q)),),
                        group_by_state(np.zeros(n * n, dtype=np.int64), heads, tails, 1), groups=groups)
    if not affine_defined(num_partitions, q):
        raise ValueError(f"affine: needs num_partitions = capacity^2 logical partitions, got "
                         f"{num_partitions} and {capacity}")
    lines = line_sequence(q)
    states, line_state = [tuple(lines[0])], {lines[0]: 0}
    for line in lines[1:]:
        slots = list(states[-1])
        incoming = [point for point in line if point not in slots]
        for slot, point in enumerate(slots):
            if point not in line:
                slots[slot] = incoming.pop()
                states.append(tuple(slots))
        line_state[line] = len(states) - 1
    groups = random_groups(num_partitions, group_size, rng)
    labels = np.empty(num_partitions * group_size, dtype=np.int64)
    for logical, group in enumerate(groups):
        labels[list(group)] = logical
    through = np.empty((num_partitions, num_partitions), dtype=np.int64)  # the state of the line through both
    on_lines = np.empty((num_partitions, q + 1), dtype=np.int64)  # the states of a point's lines
    seen = np.zeros(num_partitions, dtype=np.int64)
    for line, state in line_state.items():
        through[np.ix_(line, line)] = state
        on_lines[list(line), seen[list(line)]] = state
        seen[list(line)] += 1
    n = len(labels)
    heads, tails = np.divmod(np.arange(n * n), n)
    head_group, tail_group = labels[heads], labels[tails]
    own = on_lines[head_group, rng.integers(q + 1, size=n * n)]  # a bucket inside a group: a random line
    chosen = np.where(head_group == tail_group, own, through[head_group, tail_group])
    return Ordering("affine", num_partitions, capacity, tuple(states), group_by_state(chosen, heads, tails,
                                                                                       len(states)), groups=groups)
