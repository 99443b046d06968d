"""The partition buffer: c partitions of embeddings and optimizer state in memory.

The buffer walks a precomputed sequence of buffer states (an ordering), each
differing from the last by one partition (or one group of them). It owns
c + 1 slots: while training runs on the c resident partitions, one prefetch
thread reads the next state's admitted partition into the spare slot, and one
write-back thread writes the partition evicted at the last transition from its
old slot (every resident partition is dirty: training updates rows it samples
as negatives too). At a transition the spare slot becomes resident and the
evicted slot becomes the spare; a read into it waits for its write-back. No
slot is ever touched by two threads at once.

With a CUDA device the c + 1 slots live in GPU memory and c + 1 pinned host
slots stage the swaps (disk -> pinned host -> GPU, and back). Host memory:
``(c + 1) x partition bytes`` (embeddings + optimizer state) either way.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch

from storage.embedding_store import EmbeddingStore
from storage.partitioning import partition_bounds


@dataclass
class IOCounters:
    """Partition IO of a buffer, readable while it runs (``snapshot()``)."""

    partitions_read: int = 0
    partitions_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_read(self, nbytes: int) -> None:
        with self._lock:
            self.partitions_read += 1
            self.bytes_read += nbytes

    def add_write(self, nbytes: int) -> None:
        with self._lock:
            self.partitions_written += 1
            self.bytes_written += nbytes

    def snapshot(self) -> dict:
        with self._lock:
            return {"partitions_read": self.partitions_read, "partitions_written": self.partitions_written,
                    "bytes_read": self.bytes_read, "bytes_written": self.bytes_written}


@dataclass
class BufferView:
    """Where each resident partition sits in the buffer's tables during one state."""

    index: int                       # position of the state in the sequence
    partitions: tuple[int, ...]
    slot_of_partition: torch.Tensor  # [p] slot index, -1 when not resident (on the table's device)
    rows_per_partition: int
    resident_ranges: list[tuple[int, int]]  # (first local row, valid rows) per resident partition

    def local_ids(self, global_ids: torch.Tensor) -> torch.Tensor:
        """Buffer-local row of each global node id (all must be resident)."""
        rows = self.rows_per_partition
        return self.slot_of_partition[global_ids // rows] * rows + global_ids % rows


class PartitionBuffer:
    """Slots of partitions read from and written back to an ``EmbeddingStore``.

    ``capacity`` partitions are resident at a time; ``swap_size`` more slots
    receive the next state's admissions ahead of time (1 for one-level
    orderings, the group size for two-level ones).
    """

    def __init__(self, store: EmbeddingStore, capacity: int, device: torch.device | str = "cpu",
                 swap_size: int = 1):
        self.store = store
        self.capacity = capacity
        self.swap_size = swap_size
        self.device = torch.device(device)
        self.files = store.chunk_files()
        self.rows = store.rows_per_partition
        self.num_partitions = store.num_partitions
        self.num_slots = capacity + swap_size
        pin = self.device.type == "cuda"
        self._host = [torch.empty(self.num_slots * self.rows, f.cols, pin_memory=pin) for f in self.files]
        self.tables = self._host if self.device.type == "cpu" else \
            [torch.empty(self.num_slots * self.rows, f.cols, device=self.device) for f in self.files]
        self.counters = IOCounters()
        self._slot_of: dict[int, int] = {}
        self._free: list[int] = []
        self._writes: dict[int, Future] = {}  # slot -> its pending write-back
        self._reads: list[Future] = []        # prefetches not yet waited for
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="buffer-prefetch")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="buffer-writeback")

    @staticmethod
    def bytes_needed(rows_per_partition: int, row_bytes: int, capacity: int, swap_size: int = 1) -> int:
        """Host memory the slots take (``row_bytes``: embedding + optimizer state of one row)."""
        return (capacity + swap_size) * rows_per_partition * row_bytes

    @property
    def embeddings(self) -> torch.Tensor:
        return self.tables[0]

    @property
    def state(self) -> torch.Tensor:
        return self.tables[1]

    # ---- slot IO (runs on the helper threads) ----
    def _slot_rows(self, slot: int) -> slice:
        return slice(slot * self.rows, (slot + 1) * self.rows)

    def _read(self, partition: int, slot: int) -> None:
        pending = self._writes.get(slot)
        if pending is not None:
            pending.result()  # a spare slot is free once its write-back finished
        rows, nbytes = self._slot_rows(slot), 0
        for files, host, table in zip(self.files, self._host, self.tables):
            nbytes += files.read_into(partition, host[rows].numpy())
            if table is not host:
                table[rows].copy_(host[rows])
        self.counters.add_read(nbytes)

    def _write(self, partition: int, slot: int) -> None:
        rows, nbytes = self._slot_rows(slot), 0
        for files, host, table in zip(self.files, self._host, self.tables):
            if table is not host:
                host[rows].copy_(table[rows])
            nbytes += files.write(partition, host[rows].numpy())
        self.counters.add_write(nbytes)

    # ---- walking the states ----
    def _view(self, index: int, partitions: Sequence[int]) -> BufferView:
        slot_of = torch.full((self.num_partitions,), -1, dtype=torch.long)
        ranges = []
        for partition in sorted(partitions):
            slot = self._slot_of[partition]
            slot_of[partition] = slot
            start, end = partition_bounds(self.store.num_nodes, self.num_partitions, partition)
            ranges.append((slot * self.rows, end - start))
        return BufferView(index, tuple(partitions), slot_of.to(self.device), self.rows, ranges)

    def walk(self, states: Sequence[Sequence[int]]) -> Iterator[BufferView]:
        """Yield a view per state (the storage partitions resident in it).

        Admissions of state k + 1 are read while state k trains; evictions are
        written back behind. Call ``flush()`` after the last state.
        """
        self._fill(sorted(states[0]))
        prefetch = self._prefetch(states, 1)
        yield self._view(0, states[0])
        for index in range(1, len(states)):
            evicted = sorted(set(states[index - 1]) - set(states[index]))
            for partition, (slot, future) in prefetch.items():
                future.result()
                self._slot_of[partition] = slot
            for partition in evicted:
                slot = self._slot_of.pop(partition)
                self._writes[slot] = self._writer.submit(self._write, partition, slot)
                self._free.append(slot)
            prefetch = self._prefetch(states, index + 1)
            yield self._view(index, states[index])

    def _prefetch(self, states: Sequence[Sequence[int]], index: int) -> dict[int, tuple[int, Future]]:
        """Start reading state ``index``'s admitted partitions into free slots: {partition: (slot, read)}."""
        if index >= len(states):
            return {}
        admitted = sorted(set(states[index]) - set(states[index - 1]))
        if len(admitted) > len(self._free) or \
                len(admitted) != len(set(states[index - 1]) - set(states[index])):
            raise ValueError(f"state {index} swaps {len(admitted)} partitions; the buffer swaps at most "
                             f"{self.swap_size} and keeps {self.capacity} resident")
        slots = {partition: self._free.pop(0) for partition in admitted}
        prefetch = {partition: (slot, self._reader.submit(self._read, partition, slot))
                    for partition, slot in slots.items()}
        self._reads = [future for _, future in prefetch.values()]
        return prefetch

    def _fill(self, partitions: list[int]) -> None:
        """Initial fill: the first state's partitions into the first slots (in partition order)."""
        if len(partitions) > self.capacity:
            raise ValueError(f"a state holds {len(partitions)} partitions, capacity is {self.capacity}")
        self.flush()  # also waits for reads an abandoned walk left in flight
        for slot, partition in enumerate(partitions):
            self._read(partition, slot)
            self._slot_of[partition] = slot
        self._free = list(range(len(partitions), self.num_slots))

    def flush(self) -> None:
        """Write every resident partition back and wait for all IO (end of an epoch).

        Prefetched partitions not yet admitted are dropped (they are unmodified).
        """
        for future in self._reads:
            future.result()
        self._reads = []
        for partition, slot in sorted(self._slot_of.items()):
            self._writes[slot] = self._writer.submit(self._write, partition, slot)
        for future in self._writes.values():
            future.result()
        self._writes = {}
        self._slot_of = {}

    def close(self) -> None:
        self._reader.shutdown(wait=True)
        self._writer.shutdown(wait=True)
