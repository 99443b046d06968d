"""Negatives from outside the buffer: a few rows of every partition kept next to the buffer's slots.

Out of core, an edge's negatives come from the partitions resident with it;
with a fixed ordering an edge of bucket (i, j) at c=2 never meets a node of
any other partition (bench/RESULTS.md, "Why BETA misses"). The cache holds,
for every storage partition p, a block of ``rows(p)`` of its rows; while p is
not resident those rows join the candidates negatives are drawn from.

Layout: the cache is a region of the buffer's own tables after the slots
(row ``base + p * block`` onward for partition p), so a cached row is a
candidate like a resident one and the training step needs nothing new. The
block of p is a contiguous run of its rows starting at an offset drawn per
(seed, epoch, p): node ids are a seeded random permutation (preprocessing),
so a run is a uniform sample, and a run is one read.

Refresh (``refresh``):
- ``evict`` (default): at the start of every epoch the whole cache is read
  from the store (the only extra IO: ``rows x d x 4`` bytes per partition and
  epoch, ``rows x (d + state) x 4`` with ``defer``), and whenever a partition
  is evicted its block is copied from the slot, the freshest values, at no IO.
- ``epoch``: only the read at the start of the epoch.

Draws (``draws``): ``rows`` (default): a cached row is as likely a negative
as a resident row; ``partitions``: a block is drawn as often as its whole
partition would be in memory (its rows repeated), so negatives come from
every partition in proportion to its size, as in memory. 1-vs-all scoring
(``num_negatives=-1``) scores every candidate row once, whatever ``draws``.

Tables in bfloat16 (``storage.dtype``) hold their blocks in bfloat16 too: the
reads are half, and ``defer`` adds a block's change in float32 and rounds the
sum stochastically, as the step rounds its updates (to nearest, changes under
half a bfloat16 step would be lost every time, and accumulators only grow),
seeded by (seed, epoch, partition, admission) so a run repeats exactly.

Mid-epoch commits (``training.checkpoint_interval``) are off with a cache:
its blocks are not part of a checkpoint.

Gradients (``gradients``):
- ``drop`` (default): cached rows are read-only. Their Adagrad accumulator in
  the cache is +inf, so every update the step makes to them is exactly 0
  (``-lr g / sqrt(inf)``) and no step needs to know which rows are cached;
  only their embeddings are read from the store.
- ``defer``: the step updates a cached row in place like any candidate
  (embedding and accumulator, both read from the store). When the partition
  is next admitted in the same epoch, the cached rows' change since their last
  refresh (or last admission) is added to the partition's rows. Changes still
  pending when the epoch ends are dropped, so an epoch starts from the store
  alone and a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import numpy as np
import torch

from marius_py.storage.chunk_files import raw_bytes
from marius_py.storage.partitioning import partition_bounds
from marius_py.storage.rounding import round_stochastic_bfloat16

REFRESH_POLICIES = ("evict", "epoch")
GRADIENT_POLICIES = ("drop", "defer")
DRAW_POLICIES = ("rows", "partitions")


def cached_rows(rows_per_partition: int, fraction: float) -> int:
    """Rows cached per partition: ``fraction`` of a partition, at least 1 (0 when the cache is off)."""
    return max(1, round(fraction * rows_per_partition)) if fraction > 0 else 0


def cache_row_bytes(dim: int, state_dim: int, gradients: str, itemsize: int) -> int:
    """Bytes the cache reads per row of ``itemsize``-byte values: the embedding, and with ``defer`` the optimizer
    state."""
    return (dim + (state_dim if gradients == "defer" else 0)) * itemsize


def cache_bytes_per_epoch(num_nodes: int, num_partitions: int, fraction: float, row_bytes: int) -> int:
    """Bytes the cache reads from the store per epoch: every partition's block of ``row_bytes`` rows."""
    return sum(block_sizes(num_nodes, num_partitions, fraction)) * row_bytes


def block_sizes(num_nodes: int, num_partitions: int, fraction: float) -> list[int]:
    """Rows of every partition's block (a short last partition gives a shorter block)."""
    block = cached_rows(partition_bounds(num_nodes, num_partitions, 0)[1], fraction)  # the first is the largest
    return [min(block, end - start) for start, end in
            (partition_bounds(num_nodes, num_partitions, p) for p in range(num_partitions))]


def merged(rows: torch.Tensor, change: torch.Tensor, seed: int, salt: int = 0) -> torch.Tensor:
    """``rows + change`` in ``rows``' dtype: exact in float32, rounded stochastically into bfloat16."""
    if rows.dtype != torch.bfloat16:
        return rows + change
    return round_stochastic_bfloat16(rows.float() + change, seed, salt)


class NegativeCache:
    """Blocks of every partition's rows in a region of the buffer tables (module docstring)."""

    def __init__(self, num_nodes: int, num_partitions: int, rows_per_partition: int, fraction: float,
                 refresh: str = "evict", gradients: str = "drop", seed: int = 0, draws: str = "rows"):
        if refresh not in REFRESH_POLICIES or gradients not in GRADIENT_POLICIES or draws not in DRAW_POLICIES:
            raise ValueError(f"refresh {refresh!r} / gradients {gradients!r} / draws {draws!r}: expected one of "
                             f"{REFRESH_POLICIES} / {GRADIENT_POLICIES} / {DRAW_POLICIES}")
        self.draws = draws
        self.block = cached_rows(rows_per_partition, fraction)
        self.base = 0  # the first table row of the cache: set by the PartitionBuffer that holds it
        self.refresh, self.gradients, self.seed = refresh, gradients, seed
        self.valid = [end - start for start, end in
                      (partition_bounds(num_nodes, num_partitions, p) for p in range(num_partitions))]
        self.counts = block_sizes(num_nodes, num_partitions, fraction)
        self.offsets = [0] * num_partitions
        self.num_rows = self.block * num_partitions
        self._snapshot: list[torch.Tensor] | None = None  # defer: the cache at its last refresh or admission
        self._epoch, self._admissions = 0, 0  # defer: what seeds the rounding of bfloat16 merges

    def region(self, partition: int) -> slice:
        """The table rows of ``partition``'s block."""
        start = self.base + partition * self.block
        return slice(start, start + self.counts[partition])

    def rows_in_partition(self, partition: int) -> np.ndarray:
        """Which of the partition's rows its block holds (a run from this epoch's offset, wrapping)."""
        return (self.offsets[partition] + np.arange(self.counts[partition])) % max(1, self.valid[partition])

    def ranges(self, resident) -> list[tuple[int, int, int]]:
        """(first table row, rows, draw span) of the blocks of every partition not in ``resident``: with
        ``draws == "partitions"`` a block is drawn as often as its partition's rows would be."""
        resident = set(resident)
        return [(self.region(p).start, self.counts[p],
                 self.valid[p] if self.draws == "partitions" else self.counts[p])
                for p in range(len(self.valid)) if p not in resident and self.counts[p]]

    def fill(self, epoch: int, files, tables: list[torch.Tensor]) -> int:
        """Draw this epoch's blocks and read them from the store into ``tables``; the bytes read."""
        rng = np.random.default_rng([self.seed, epoch, 0xCAC4E])
        self._epoch, self._admissions = epoch, 0
        self.offsets = [int(rng.integers(max(1, valid))) for valid in self.valid]
        nbytes = 0
        for chunk_files, table in zip(files, tables if self.gradients == "defer" else tables[:1]):
            region = torch.empty(self.num_rows, table.shape[1], dtype=table.dtype)
            for p in range(len(self.valid)):
                first, count = self.offsets[p], self.counts[p]
                head = min(count, self.valid[p] - first)
                block = raw_bytes(region[p * self.block:p * self.block + count])
                nbytes += chunk_files.read_rows(p, first, head, block[:head])
                if count > head:  # the run wraps to the partition's first rows
                    nbytes += chunk_files.read_rows(p, 0, count - head, block[head:])
            table[self.base:self.base + self.num_rows].copy_(region)
        if self.gradients == "drop":
            tables[1][self.base:self.base + self.num_rows] = float("inf")  # read-only: every update is 0
        self._remember(tables)
        return nbytes

    def _slot_rows(self, partition: int, slot_start: int, device: torch.device) -> torch.Tensor:
        """The table rows, in the slot at ``slot_start``, of the rows ``partition``'s block holds."""
        return slot_start + torch.from_numpy(self.rows_in_partition(partition)).to(device)

    def evicted(self, partition: int, tables: list[torch.Tensor], slot_start: int) -> None:
        """``partition`` leaves the buffer from the slot at ``slot_start``: refresh its block from there."""
        if self.refresh != "evict" or not self.counts[partition]:
            return
        rows = self._slot_rows(partition, slot_start, tables[0].device)
        region = self.region(partition)
        for table in tables if self.gradients == "defer" else tables[:1]:
            table[region] = table[rows]
        if self._snapshot is not None:
            for table, snapshot in zip(tables, self._snapshot):
                snapshot[region.start - self.base:region.stop - self.base] = table[region]

    def admitted(self, partition: int, tables: list[torch.Tensor], slot_start: int) -> None:
        """``partition`` enters the slot at ``slot_start``: with ``defer``, add its block's pending change."""
        if self._snapshot is None or not self.counts[partition]:
            return
        rows = self._slot_rows(partition, slot_start, tables[0].device)
        region = self.region(partition)
        local = slice(region.start - self.base, region.stop - self.base)
        self._admissions += 1
        seed = int(np.random.SeedSequence([self.seed, self._epoch, partition, self._admissions]).generate_state(1)[0])
        for salt, (table, snapshot) in enumerate(zip(tables, self._snapshot)):
            change = table[region].float() - snapshot[local].float()
            table[rows] = merged(table[rows], change, seed, salt)  # a block's rows are distinct
            snapshot[local] = table[region]

    def _remember(self, tables: list[torch.Tensor]) -> None:
        if self.gradients == "defer":
            self._snapshot = [table[self.base:self.base + self.num_rows].clone() for table in tables]
