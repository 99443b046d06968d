"""The ``Ordering`` type and the helpers every ordering shares.

Vocabulary (the same words as ``storage/``):

partition
    an integer in ``[0, num_partitions)``: a *logical* partition, the unit the
    buffer holds in one slot.
storage partition
    a partition of the embedding store on disk (``storage.partitioning``). For
    one-level orderings a storage partition *is* a logical partition; for
    two-level orderings (``groups`` set) each logical partition is a group of
    storage ("physical") partitions chosen for this epoch.
bucket
    ``(i, j)``: the edges whose source is in storage partition ``i`` and whose
    destination is in storage partition ``j``.
state
    the buffer's contents as slots: ``state[s]`` is the partition in slot ``s``.
swap
    the step from one state to the next: one slot's partition is evicted and
    another admitted into the same slot.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

Bucket = tuple[int, int]
State = tuple[int, ...]


class Swap(NamedTuple):
    """One buffer swap. ``state`` is the index of the state the swap leads *to*."""

    state: int
    slot: int
    evicted: int
    admitted: int


@dataclass(frozen=True)
class Ordering:
    """A sequence of buffer states and the assignment of every bucket to one state.

    ``states[k][s]`` is the logical partition in slot ``s`` during state ``k``;
    consecutive states differ in exactly one slot. ``buckets[k]`` lists the
    buckets trained during state ``k`` (possibly none), in storage-partition ids,
    in the order the ordering visits them (trainers shuffle edges anyway).

    ``groups`` is ``None`` for one-level orderings. For two-level orderings
    ``groups[l]`` is the sorted tuple of storage partitions that logical
    partition ``l`` stands for this epoch; the groups partition
    ``range(num_physical_partitions)``. A trainer admitting logical partition
    ``l`` loads all of ``groups[l]`` (and writes all of them back on eviction).

    ``seed``, ``epoch`` and ``options`` record how it was built:
    ``build_ordering(name, num_partitions, capacity, seed, epoch, **options)``
    rebuilds it exactly, then ``continued(ordering, continues)`` where
    ``continues`` is set.
    """

    name: str
    num_partitions: int
    capacity: int
    states: tuple[State, ...]
    buckets: tuple[tuple[Bucket, ...], ...]
    groups: tuple[tuple[int, ...], ...] | None = None
    seed: int = 0
    epoch: int = 0
    options: tuple[tuple[str, object], ...] = ()
    continues: tuple[int, ...] = ()  # (``continued``: the storage partitions its first state was renamed to hold)

    # ------------------------------------------------------------ derived views
    @property
    def num_states(self) -> int:
        return len(self.states)

    @property
    def num_swaps(self) -> int:
        return len(self.states) - 1

    @property
    def num_physical_partitions(self) -> int:
        """Storage partitions: ``num_partitions`` unless ``groups`` is set."""
        if self.groups is None:
            return self.num_partitions
        return sum(len(g) for g in self.groups)

    def partitions_of(self, partition: int) -> tuple[int, ...]:
        """Storage partitions that logical ``partition`` stands for."""
        return (partition,) if self.groups is None else self.groups[partition]

    def resident(self, state: int) -> tuple[int, ...]:
        """Sorted storage partitions held by the buffer during ``state``."""
        return tuple(sorted(q for lp in self.states[state] for q in self.partitions_of(lp)))

    def swaps(self) -> list[Swap]:
        """Every swap, in order: ``Swap(state, slot, evicted, admitted)``."""
        out = []
        for k in range(1, len(self.states)):
            prev, cur = self.states[k - 1], self.states[k]
            for slot, (a, b) in enumerate(zip(prev, cur)):
                if a != b:
                    out.append(Swap(k, slot, a, b))
        return out

    def assignment(self) -> dict[Bucket, int]:
        """Bucket -> index of the state it is trained in."""
        return {b: k for k, state_buckets in enumerate(self.buckets) for b in state_buckets}

    # --------------------------------------------------------------- checking
    def validate(self) -> "Ordering":
        """Check every invariant; raise ``AssertionError`` naming the first broken one."""
        p, c, name = self.num_partitions, self.capacity, self.name
        check_sizes(p, c, what=f"{name}: ")
        _check(len(self.states) >= 1, f"{name}: no states")
        _check(len(self.buckets) == len(self.states),
               f"{name}: {len(self.buckets)} bucket lists for {len(self.states)} states")
        for k, state in enumerate(self.states):
            _check(len(state) == c, f"{name}: state {k} has {len(state)} slots, capacity is {c}")
        slots = np.asarray(self.states, dtype=np.int64)
        bad = np.flatnonzero(((slots < 0) | (slots >= p)).any(axis=1))
        _check(len(bad) == 0, lambda: f"{name}: state {bad[0]} = {self.states[bad[0]]} has a partition "
                                      f"outside [0, {p})")
        ordered = np.sort(slots, axis=1)
        bad = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
        _check(len(bad) == 0, lambda: f"{name}: state {bad[0]} = {self.states[bad[0]]} holds a partition twice")
        num_changed = (slots[1:] != slots[:-1]).sum(axis=1)
        bad = np.flatnonzero(num_changed != 1)
        _check(len(bad) == 0, lambda: f"{name}: state {bad[0]} -> {bad[0] + 1} changes slots "
                                      f"{np.flatnonzero(slots[bad[0]] != slots[bad[0] + 1]).tolist()}, "
                                      f"expected exactly one ({self.states[bad[0]]} -> {self.states[bad[0] + 1]})")
        labels = self._labels()
        num_physical = len(labels)
        pairs = [(k, i, j) for k, bs in enumerate(self.buckets) for i, j in bs]
        _check(len(pairs) == num_physical ** 2,
               f"{name}: {len(pairs)} buckets assigned, expected {num_physical}^2 = {num_physical ** 2}")
        arr = np.array(pairs, dtype=np.int64).reshape(-1, 3)
        k_arr, i_arr, j_arr = arr[:, 0], arr[:, 1], arr[:, 2]
        in_range = (i_arr >= 0) & (i_arr < num_physical) & (j_arr >= 0) & (j_arr < num_physical)
        if not in_range.all():
            bad = int(np.flatnonzero(~in_range)[0])
            raise AssertionError(f"{name}: bucket {pairs[bad][1:]} (state {pairs[bad][0]}) "
                                 f"is outside [0, {num_physical})^2")
        counts = np.bincount(i_arr * num_physical + j_arr, minlength=num_physical ** 2)
        if (counts != 1).any():
            bad = int(np.flatnonzero(counts != 1)[0])
            raise AssertionError(f"{name}: bucket {divmod(bad, num_physical)} assigned "
                                 f"{int(counts[bad])} times, expected once")
        member = membership(self.states, p)
        held = member[k_arr, labels[i_arr]] & member[k_arr, labels[j_arr]]
        if not held.all():
            k, i, j = pairs[int(np.flatnonzero(~held)[0])]
            raise AssertionError(f"{name}: bucket {(i, j)} assigned to state {k} = {self.states[k]}, "
                                 f"which does not hold both its partitions")
        return self

    def _labels(self) -> np.ndarray:
        """Logical partition of every storage partition (checks ``groups``)."""
        if self.groups is None:
            return np.arange(self.num_partitions)
        name = self.name
        _check(len(self.groups) == self.num_partitions,
               f"{name}: {len(self.groups)} groups for {self.num_partitions} logical partitions")
        flat = [q for g in self.groups for q in g]
        _check(all(len(g) >= 1 for g in self.groups), f"{name}: an empty group")
        _check(sorted(flat) == list(range(len(flat))),
               f"{name}: groups do not partition range({len(flat)}) (each storage partition exactly once)")
        labels = np.empty(len(flat), dtype=np.int64)
        for lp, g in enumerate(self.groups):
            labels[list(g)] = lp
        return labels


def _check(condition: bool, message) -> None:
    """Raise ``AssertionError(message)`` (``message`` may be a callable, built only on failure)."""
    if not condition:
        raise AssertionError(message() if callable(message) else message)


def check_sizes(num_partitions: int, capacity: int, what: str = "") -> None:
    """``1 <= c <= p`` and ``c >= 2`` unless ``c == p`` (a bucket needs both partitions)."""
    p, c = num_partitions, capacity
    if not (isinstance(p, (int, np.integer)) and isinstance(c, (int, np.integer))):
        raise ValueError(f"{what}num_partitions and capacity must be integers, got {p!r}, {c!r}")
    if p < 1:
        raise ValueError(f"{what}num_partitions must be >= 1, got {p}")
    if not 1 <= c <= p:
        raise ValueError(f"{what}capacity must be in [1, num_partitions={p}], got {c}")
    if c < 2 and c != p:
        raise ValueError(f"{what}capacity must be >= 2 when capacity < num_partitions "
                         f"(a bucket needs both its partitions in the buffer), got {c}")


def membership(states, num_partitions: int) -> np.ndarray:
    """Boolean ``(num_states, num_partitions)``: does state k hold partition q."""
    arr = np.asarray(states, dtype=np.int64)
    out = np.zeros((len(arr), num_partitions), dtype=bool)
    out[np.arange(len(arr))[:, None], arr] = True
    return out


def assign_buckets(states, num_partitions: int, rng: np.random.Generator | None = None,
                   labels: np.ndarray | None = None) -> tuple[tuple[Bucket, ...], ...]:
    """Assign every storage bucket to one state holding both its partitions.

    ``labels[q]`` is the logical partition of storage partition ``q`` (identity
    when ``None``). With ``rng=None`` each bucket goes to the *first* eligible
    state (BETA's greedy rule); otherwise to a state drawn uniformly among the
    eligible ones. Buckets are listed row-major within each state.
    """
    p = num_partitions
    labels = np.arange(p) if labels is None else np.asarray(labels, dtype=np.int64)
    member = membership(states, p)
    num_states = len(member)
    eligible = (member[:, :, None] & member[:, None, :]).reshape(num_states, p * p)
    pair_idx, state_idx = np.nonzero(eligible.T)          # pair-major, states ascending
    counts = np.bincount(pair_idx, minlength=p * p)
    if (counts == 0).any():
        bad = int(np.flatnonzero(counts == 0)[0])
        raise ValueError(f"no state holds both partitions of logical bucket {divmod(bad, p)}")
    starts = np.cumsum(counts) - counts
    num_physical = len(labels)
    heads, tails = np.divmod(np.arange(num_physical * num_physical), num_physical)
    pair = labels[heads] * p + labels[tails]
    offset = 0 if rng is None else rng.integers(0, counts[pair])
    chosen = state_idx[starts[pair] + offset]
    return group_by_state(chosen, heads, tails, num_states)


def group_by_state(chosen: np.ndarray, heads: np.ndarray, tails: np.ndarray,
                   num_states: int) -> tuple[tuple[Bucket, ...], ...]:
    """Per-state bucket tuples from parallel arrays (stable: keeps input order)."""
    per_state: list[list[Bucket]] = [[] for _ in range(num_states)]
    for k, i, j in zip(chosen.tolist(), heads.tolist(), tails.tolist()):
        per_state[k].append((i, j))
    return tuple(tuple(bs) for bs in per_state)


def relabel(ordering: Ordering, permutation) -> Ordering:
    """Rename logical partition ``q`` to ``permutation[q]`` everywhere.

    Only for one-level orderings (``groups is None``), where storage partitions
    are the logical ones: a random relabelling per epoch is how BETA varies
    its states between epochs.
    """
    if ordering.groups is not None:
        raise ValueError(f"{ordering.name}: relabel a two-level ordering through its groups instead")
    perm = [int(q) for q in permutation]
    if sorted(perm) != list(range(ordering.num_partitions)):
        raise ValueError(f"not a permutation of range({ordering.num_partitions}): {perm}")
    states = tuple(tuple(perm[q] for q in state) for state in ordering.states)
    buckets = tuple(tuple((perm[i], perm[j]) for i, j in bs) for bs in ordering.buckets)
    return replace(ordering, states=states, buckets=buckets)


def continued(ordering: Ordering, carried) -> Ordering:
    """``ordering`` with its storage partitions renamed so that its first state holds ``carried``, the storage
    partitions a buffer holds from the walk before: the walk then starts with nothing to read.

    The renaming maps the first state's partitions onto ``carried`` and the others onto the rest, each in
    increasing order, so the result is a function of its two arguments alone. Renaming keeps every property
    ``validate`` checks; how the states sweep the buckets is the built ordering's own. ``carried`` of another
    size than a state leaves the ordering as built.
    """
    first, carried = ordering.resident(0), sorted(set(int(q) for q in carried))
    if len(carried) != len(first):
        return ordering
    everything = set(range(ordering.num_physical_partitions))
    renamed = np.empty(len(everything), dtype=np.int64)
    renamed[list(first)] = carried
    renamed[sorted(everything - set(first))] = sorted(everything - set(carried))
    counts = [len(bs) for bs in ordering.buckets]  # (one lookup over every bucket: per-bucket Python is slow)
    flat = renamed[np.concatenate([np.asarray(bs, dtype=np.int64).reshape(-1, 2) for bs in ordering.buckets])]
    pairs = list(zip(flat[:, 0].tolist(), flat[:, 1].tolist()))
    ends = np.cumsum(counts).tolist()
    buckets = tuple(tuple(pairs[end - count:end]) for count, end in zip(counts, ends))
    if ordering.groups is None:
        states = tuple(tuple(renamed[list(state)].tolist()) for state in ordering.states)
        return replace(ordering, states=states, buckets=buckets, continues=tuple(carried))
    groups = tuple(tuple(sorted(renamed[list(group)].tolist())) for group in ordering.groups)
    return replace(ordering, groups=groups, buckets=buckets, continues=tuple(carried))
