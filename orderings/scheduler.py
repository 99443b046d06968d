"""Bucket scheduling for several trainers that hand partitions to each other (issue 15's lock server).

As PyTorch-BigGraph's lock server, rank 0 hands each trainer an edge bucket
(i, j) whose partitions no other trainer holds, preferring buckets that share
partitions with what the trainer holds already, so it swaps less, and among
those one at random (seeded per epoch), so that each epoch pairs partitions
and trains them in an order of its own: a fixed greedy order costs accuracy,
as it does for one process's orderings. Every bucket is handed out exactly
once per epoch; the epoch ends when all are done.

A partition's latest copy is in the local store of the trainer that wrote it
last (``locations``). A grant names, for each partition the trainer must
read, the trainer it comes from (``Grant.sources``: itself, a read from its
own disk, or another trainer, which the scheduler then orders to send it:
``next_send``). Holding follows that consistency: a trainer that moves on
from bucket (i, j) to (i, k) keeps i, and j stays locked until the trainer
reports it written back (``written``): only then may it be sent on. Pure
bookkeeping (no IO, no torch): the distributed trainer calls it through
torch.distributed; tests drive it with simulated trainers.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Send:
    """An order to a trainer: send ``partition`` (written in its store) to ``destination``."""

    partition: int
    destination: int


@dataclass
class Grant:
    """The scheduler's answer to a trainer that has finished its bucket (or starts), or that asks ahead
    while its bucket trains (an empty ahead answer has nothing to write back: the trainer keeps what it
    holds)."""

    bucket: tuple[int, int] | None  # None: no bucket for now (``finished`` says whether ever again)
    read: tuple[int, ...]           # partitions to load from the store (nobody holds them; written back)
    write_back: tuple[int, ...]     # partitions to write back first, then report them ``written``
    finished: bool = False          # no bucket is left this epoch
    together: tuple[tuple[int, int], ...] = ()  # the other buckets left among the same partitions
    sources: tuple[int, ...] = ()   # per partition of ``read``: the trainer it comes from (itself: its disk)

    @property
    def buckets(self) -> tuple[tuple[int, int], ...]:
        """Every bucket granted: trained together, as one shuffled span (as a buffer state's buckets are)."""
        return () if self.bucket is None else (self.bucket, *self.together)


@dataclass
class BucketScheduler:
    """Which trainer holds which partitions, and which buckets of the epoch are left."""

    num_partitions: int
    buckets: list[tuple[int, int]]
    seed: int = 0
    capacity: int = 2  # partitions a trainer holds at once (its buffer)
    held: dict[int, set[int]] = field(default_factory=dict)          # trainer -> partitions it holds
    # trainer -> partition -> write-backs not yet reported: a trainer may release a partition, be granted it
    # again and release it again before the first report arrives (reports come behind training); the
    # partition stays locked until every one of its writes is reported
    releasing: dict[int, Counter] = field(default_factory=dict)
    log: list[tuple[int, tuple[int, int]]] = field(default_factory=list)  # (trainer, bucket) in grant order
    waiting: set[int] = field(default_factory=set)  # trainers whose last ask found no bucket free
    # partition -> the trainer whose store has its latest copy (a partition not named: the asking trainer's)
    locations: dict[int, int] = field(default_factory=dict)
    sends: dict[int, deque] = field(default_factory=dict)  # trainer -> its ``Send`` orders, oldest first

    def __post_init__(self):
        self._left = sorted(set(self.buckets))
        self._rng = np.random.default_rng(self.seed)

    @property
    def done(self) -> bool:
        """Every bucket handed out (trainers may still be training their last one)."""
        return not self._left

    def locked_by_others(self, trainer: int) -> set[int]:
        return {p for other, parts in [*self.held.items(), *self.releasing.items()] if other != trainer
                for p in parts}  # (a Counter keeps only partitions with writes pending: see written)

    def acquire(self, trainer: int, ahead: bool = False) -> Grant:
        """The trainer's next bucket, preferring ones that share its partitions, keeping as many of them as
        its capacity allows (those with the most buckets left), with every other bucket left among the
        partitions it then holds (``Grant.together``: trained in one shuffled span, as the buckets of
        a buffer state are; one bucket alone would train only edges from i to j for a while).

        With no bucket free of other trainers' partitions, it gets none for now and writes back all it holds
        (two trainers each holding what the other needs would otherwise wait forever); it asks again after
        another trainer reports a write-back. With none left, it writes back all it holds and is finished.

        ``ahead``: the trainer asks while it still trains its last grant, to read the next one's partitions
        meanwhile; it writes back the grant's ``write_back`` once that training is done (they stay locked
        until reported written, as always). With no bucket free, or another trainer waiting for one (it
        picks first: a trainer asking ahead would otherwise lock partition after partition, two grants'
        worth at a time, and starve it), it keeps what it holds and asks again when its training is done.
        """
        mine = self.held.pop(trainer, set())
        blocked = self.locked_by_others(trainer)
        free = [b for b in self._left if b[0] not in blocked and b[1] not in blocked]
        if ahead and self._left and (not free or self.waiting - {trainer}):
            self.held[trainer] = mine
            return Grant(None, (), ())
        if not free:
            self._release(trainer, mine)
            if self._left:
                self.waiting.add(trainer)
            return Grant(None, (), tuple(sorted(mine)), finished=not self._left)
        self.waiting.discard(trainer)
        bucket = self._pick(free, mine)
        needed = set(bucket) | self._kept(mine - set(bucket), set(bucket))
        together = tuple(b for b in self._left if b != bucket and set(b) <= needed)
        for granted in (bucket, *together):
            self._left.remove(granted)
            self.log.append((trainer, granted))
        self._release(trainer, mine - needed)
        self.held[trainer] = needed
        read = tuple(sorted(needed - mine))
        return Grant(bucket, read, tuple(sorted(mine - needed)), together=together,
                     sources=self._hand_over(read, trainer))

    def _pick(self, free: list[tuple[int, int]], mine: set[int]) -> tuple[int, int]:
        """A free bucket sharing most partitions with ``mine``, at random among those. Not the one with the most
        edges: that made every epoch's grants alike (the same bucket first, the same pairs of partitions),
        which cost accuracy (docs/design.md, "Trainers that stay busy")."""
        overlap = np.array([len(mine & set(b)) for b in free])
        return free[int(self._rng.choice(np.flatnonzero(overlap == overlap.max())))]

    def _hand_over(self, read: tuple[int, ...], trainer: int) -> tuple[int, ...]:
        """Where each partition of ``read`` comes from; another trainer is ordered to send it."""
        sources = []
        for partition in read:
            source = self.locations.get(partition, trainer)
            if source != trainer:
                self.sends.setdefault(source, deque()).append(Send(partition, trainer))
            self.locations[partition] = trainer
            sources.append(source)
        return tuple(sources)

    def next_send(self, trainer: int) -> Send | None:
        """The trainer's oldest send order not yet taken (None: none now)."""
        queue = self.sends.get(trainer)
        return queue.popleft() if queue else None

    def _kept(self, candidates: set[int], granted: set[int]) -> set[int]:
        """Which of a trainer's partitions it keeps beside the granted bucket's (up to its capacity): those
        that leave the most buckets to train with the partitions kept so far, greedily."""
        kept: set[int] = set()
        while candidates and len(granted) + len(kept) < self.capacity:
            group = granted | kept
            best = max(sorted(candidates), key=lambda q: sum(1 for a, b in self._left
                                                             if (a == q and b in group | {q})
                                                             or (b == q and a in group | {q})))
            kept.add(best)
            candidates = candidates - {best}
        return kept

    def _release(self, trainer: int, partitions: set[int]) -> None:
        if partitions:
            self.releasing.setdefault(trainer, Counter()).update(partitions)

    def written(self, trainer: int, partitions) -> None:
        """The trainer has written ``partitions`` back (one write each): other trainers may read them once every
        write of theirs is reported."""
        pending = self.releasing.setdefault(trainer, Counter())
        pending.subtract(partitions)
        for partition in [p for p, count in pending.items() if count <= 0]:
            del pending[partition]
