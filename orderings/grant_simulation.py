"""An epoch of bucket grants played out in simulated time: what each trainer trains, waits for and receives.

Trainers train a grant's edges at ``edges_per_second`` and read each partition
a grant names in ``partition_seconds``; a trainer finishing a grant writes back
what it released at once and asks again; one given no bucket waits until
another trainer's grant ends. Pure bookkeeping over ``BucketScheduler`` (numpy
only): the tests check the scheduler's balance with it, and
``bench/distributed.py`` projects a deployment's partition traffic (bytes per
trainer per epoch over the network) from it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from marius_py.orderings.scheduler import BucketScheduler


@dataclass
class TrainerTally:
    """One trainer's epoch in the simulation."""

    buckets: int = 0
    edges: int = 0
    busy_seconds: float = 0.0      # training and reading its grants' partitions
    idle_seconds: float = 0.0      # no grant: waiting for a free bucket, or for the others to finish
    received: int = 0              # partitions handed over from other trainers
    received_from: Counter = field(default_factory=Counter)  # trainer -> partitions it handed over
    sent: int = 0                  # partitions handed over to other trainers
    disk_reads: int = 0            # partitions read from its own store


@dataclass
class EpochSimulation:
    trainers: list[TrainerTally]
    seconds: float                 # the epoch: until the last trainer finishes
    locations: dict[int, int]      # partition -> trainer whose store has it at the end

    @property
    def idle_share(self) -> float:
        """Idle time over the trainers' time: 0 when every trainer is busy until the end."""
        return sum(t.idle_seconds for t in self.trainers) / max(self.seconds * len(self.trainers), 1e-12)


def simulate_epoch(num_partitions: int, num_trainers: int, capacity: int, bucket_edges: np.ndarray,
                   seed: int = 0, locations: dict[int, int] | None = None, edges_per_second: float = 1.0,
                   partition_seconds: float = 0.0) -> EpochSimulation:
    """One epoch of ``BucketScheduler`` grants to ``num_trainers`` trainers (``bucket_edges``: [P, P] edges
    per bucket; ``locations``: where each partition starts, by default spread round-robin)."""
    p = num_partitions
    edges = {(i, j): int(bucket_edges[i, j]) for i in range(p) for j in range(p)}
    start = dict(locations) if locations is not None else {q: q % num_trainers for q in range(p)}
    scheduler = BucketScheduler(p, list(edges), seed=seed, capacity=capacity, locations=dict(start))
    tallies = [TrainerTally() for _ in range(num_trainers)]
    free_at = [0.0] * num_trainers
    finished: set[int] = set()
    while len(finished) < num_trainers:
        trainer = min((t for t in range(num_trainers) if t not in finished), key=lambda t: (free_at[t], t))
        grant = scheduler.acquire(trainer)
        scheduler.written(trainer, grant.write_back)  # (written at once: the simulation has no disk)
        if grant.bucket is None:
            if grant.finished:
                finished.add(trainer)
                continue
            busy = [free_at[t] for t in range(num_trainers) if t not in finished and free_at[t] > free_at[trainer]]
            resume = min(busy) if busy else free_at[trainer]
            tallies[trainer].idle_seconds += resume - free_at[trainer]
            free_at[trainer] = resume + (0.0 if busy else 1e-9)
            continue
        tally = tallies[trainer]
        trained = sum(edges[b] for b in grant.buckets)
        tally.buckets += len(grant.buckets)
        tally.edges += trained
        for source in grant.sources:
            if source == trainer:
                tally.disk_reads += 1
            else:
                tally.received += 1
                tally.received_from[source] += 1
                tallies[source].sent += 1
        seconds = len(grant.read) * partition_seconds + trained / edges_per_second
        tally.busy_seconds += seconds
        free_at[trainer] += seconds
    end = max(free_at)
    for trainer, tally in enumerate(tallies):
        tally.idle_seconds += end - free_at[trainer]
    return EpochSimulation(tallies, end, dict(scheduler.locations))
