"""The partition buffer: c partitions of embeddings and optimizer state in memory.

The buffer walks a precomputed sequence of buffer states (an ordering), each
differing from the last by one partition (or one group of them). It owns
c + L slots: while training runs on the c resident partitions, prefetch
threads (``storage.io_threads``, 1 by default) read the partitions the next L
states admit into spare slots, and as many write-back threads write each
evicted partition from its old slot. A partition is dirty once a state that holds
it is trained (training updates rows it samples as negatives too) until it is
written: a clean one is evicted without a write. A read waits for the write-back
of its slot's last occupant and of its own partition's last eviction. No slot is
ever touched by two threads at once.

The buffer stays filled between walks: the next walk (the next epoch) keeps the
resident partitions its first state holds, evicting the others and reading only
what is missing, instead of writing everything back and reading it again.
``write_resident`` makes the store current (a commit, an evaluation), keeping
the partitions resident; ``flush`` empties the buffer.

With a CUDA device the slots live in GPU memory and as many pinned host slots
stage the swaps (disk -> pinned host -> GPU, and back) on each IO thread's own
CUDA stream, so a swap's copy neither waits for nor holds up the kernels queued
for training; a write-back's copy waits only for the kernels launched before
its eviction (a CUDA event). Host memory:
``(c + L) x partition bytes`` (embeddings + optimizer state; slots are padded
to whole pages for O_DIRECT), ``(c + L k)`` with groups of k.

A partition may also come from elsewhere than the store (another trainer,
over torch.distributed): ``hold`` and ``prefetch`` then take a *fetch* that
fills the slot's rows; fetches run on one thread of their own, in the order
asked, so that a sender's and a receiver's sequences match.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import torch

from marius_py.storage.chunk_files import page_aligned_empty, raw_bytes, slot_rows
from marius_py.storage.embedding_store import EmbeddingStore
from marius_py.storage.partitioning import partition_bounds


Fetch = Callable[[list[torch.Tensor]], int]  # fills a slot's rows of each table; returns the bytes moved


@dataclass
class IOCounters:
    """Partition IO of a buffer, readable while it runs (``snapshot()``)."""

    partitions_read: int = 0
    partitions_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    checkpoint_bytes_written: int = 0  # resident partitions written for a commit between states
    partitions_received: int = 0       # filled by a fetch (handed over by another trainer), not read
    bytes_received: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_read(self, nbytes: int) -> None:
        with self._lock:
            self.partitions_read += 1
            self.bytes_read += nbytes

    def add_write(self, nbytes: int) -> None:
        with self._lock:
            self.partitions_written += 1
            self.bytes_written += nbytes

    def add_received(self, nbytes: int) -> None:
        with self._lock:
            self.partitions_received += 1
            self.bytes_received += nbytes

    def add_checkpoint_write(self, nbytes: int) -> None:
        with self._lock:
            self.checkpoint_bytes_written += nbytes

    def snapshot(self) -> dict:
        with self._lock:
            return {"partitions_read": self.partitions_read, "partitions_written": self.partitions_written,
                    "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                    "checkpoint_bytes_written": self.checkpoint_bytes_written,
                    "partitions_received": self.partitions_received, "bytes_received": self.bytes_received}


@dataclass
class BufferView:
    """Where each resident partition sits in the buffer's tables during one state."""

    index: int                       # position of the state in the sequence
    partitions: tuple[int, ...]
    slot_of_partition: torch.Tensor  # [p] slot index, -1 when not resident (host memory)
    rows_per_partition: int
    rows_per_slot: int               # >= rows_per_partition: slots are padded to whole pages
    resident_ranges: list[tuple[int, int]]  # (first local row, valid rows) per resident partition
    candidate_ranges: list[tuple[int, int]]  # negatives' rows: the resident partitions' (first row, rows)

    def local_ids(self, global_ids: torch.Tensor) -> torch.Tensor:
        """Buffer-local row of each global node id (all must be resident)."""
        rows = self.rows_per_partition
        slots = self.slot_of_partition.to(global_ids.device)
        return slots[global_ids // rows] * self.rows_per_slot + global_ids % rows


class PartitionBuffer:
    """Slots of partitions read from and written back to an ``EmbeddingStore``.

    ``capacity`` partitions are resident at a time. ``swap_size`` partitions
    change per state (1 for one-level orderings, the group size for two-level
    ones), and the admissions of the next ``lookahead`` states are read ahead
    into ``swap_size x lookahead`` spare slots, so a state with little training
    still finds its next partition read.
    """

    def __init__(self, store: EmbeddingStore, capacity: int, device: torch.device | str = "cpu",
                 swap_size: int = 1, lookahead: int = 2, pin_memory: bool = False,
                 direct_io: bool = True, io_threads: int = 1):
        """``direct_io``: partition IO
        bypasses the page cache (O_DIRECT) where the file system allows. ``io_threads``: reading threads,
        and as many writing (each slot still has one reader or writer at a time: a read waits for its
        slot's and its partition's last write)."""
        self.store = store
        self.capacity = capacity
        self.swap_size = swap_size
        self.lookahead = lookahead
        self.device = torch.device(device)
        self.files = store.chunk_files(direct_io)
        self.rows = store.rows_per_partition
        self.dtype = store.dtype
        self.stride = slot_rows(self.rows, *(f.cols for f in self.files), itemsize=self.dtype.itemsize)
        self.num_partitions = store.num_partitions
        self.num_slots = capacity + swap_size * lookahead
        slot_rows_total = self.num_slots * self.stride
        table_rows = slot_rows_total
        pin = self.device.type == "cuda" or pin_memory  # host slots that GPU kernels read in place are pinned too
        if self.device.type == "cpu":  # the host slots are the tables
            self._host = [page_aligned_empty(table_rows, f.cols, pin, self.dtype) for f in self.files]
            self.tables = self._host
        else:
            self._host = [page_aligned_empty(slot_rows_total, f.cols, pin, self.dtype) for f in self.files]
            self.tables = [torch.empty(table_rows, f.cols, device=self.device, dtype=self.dtype) for f in self.files]
        self.counters = IOCounters()
        self._slot_of: dict[int, int] = {}                   # resident partition -> slot
        self._free: list[int] = list(range(self.num_slots))
        self._scheduled: dict[int, tuple[int, Future]] = {}  # prefetched partition -> (slot, read)
        self._slot_writes: dict[int, Future] = {}            # slot -> write-back of its last occupant
        self._dirty: set[int] = set()                        # resident partitions trained since their last write
        self._partition_writes: dict[int, Future] = {}       # partition -> its last write-back
        # slots move to and from the GPU on streams of the IO threads' own, beside training on the default
        # stream (one per thread: a read's copy must not queue behind a write-back's, which waits for training)
        self._copy_streams = threading.local() if self.device.type == "cuda" else None
        self._reader = ThreadPoolExecutor(io_threads, thread_name_prefix="buffer-prefetch")
        self._receiver = ThreadPoolExecutor(1, thread_name_prefix="buffer-fetch")  # fetches, in order
        self._writer = ThreadPoolExecutor(io_threads, thread_name_prefix="buffer-writeback")

    @staticmethod
    def bytes_needed(rows_per_partition: int, cols: tuple[int, ...], capacity: int, swap_size: int = 1,
                     lookahead: int = 2, itemsize: int = 4) -> int:
        """Memory of the tables' slots (``cols``: widths of the embedding and optimizer-state tables, of
        ``itemsize``-byte values)."""
        slots = (capacity + swap_size * lookahead) * slot_rows(rows_per_partition, *cols, itemsize=itemsize)
        return slots * itemsize * sum(cols)

    @property
    def partition_bytes(self) -> int:
        """Bytes of one partition as stored and handed over: a chunk of each table."""
        return sum(f.chunk_bytes for f in self.files)

    @property
    def host_slots(self) -> list[torch.Tensor]:
        """The host memory partitions are read into and written from: on a GPU, copied to and from
        ``tables`` at every read and write; on a CPU, the tables themselves."""
        return self._host

    @property
    def embeddings(self) -> torch.Tensor:
        return self.tables[0]

    @property
    def state(self) -> torch.Tensor:
        return self.tables[1]

    # ---- slot IO (runs on the helper threads) ----
    def _slot_rows(self, slot: int) -> slice:
        return slice(slot * self.stride, (slot + 1) * self.stride)

    def _read(self, partition: int, slot: int, fetch: Fetch | None = None) -> int | None:
        """Fill ``slot`` with ``partition``; the bytes read from the store (counted where the partition is
        admitted, or dropped: a read ahead for the next walk counts in that walk's IO), None for a fetch
        (counted as received)."""
        # The slot's last occupant and the partition's own last eviction must be on disk first.
        for pending in (self._slot_writes.get(slot), self._partition_writes.get(partition)):
            if pending is not None:
                pending.result()
        # (a slot freed by an eviction: the GPU's last use of its rows preceded that write's copy)
        rows, nbytes = self._slot_rows(slot), 0
        if fetch is not None:
            with self._on_copy_stream():
                nbytes = fetch([table[rows][:self.rows] for table in self.tables])
            self.counters.add_received(nbytes)
            return None
        for files, host, table in zip(self.files, self._host, self.tables):
            nbytes += files.read_into(partition, raw_bytes(host[rows]))
            if table is not host:
                with self._on_copy_stream():
                    table[rows].copy_(host[rows])  # (returns once copied)
        return nbytes

    def _on_copy_stream(self):
        """The calling thread's copy stream, as the current stream (a null context without a GPU)."""
        if self._copy_streams is None:
            return contextlib.nullcontext()
        if not hasattr(self._copy_streams, "stream"):
            self._copy_streams.stream = torch.cuda.Stream(self.device)
        return torch.cuda.stream(self._copy_streams.stream)

    def _submit_write(self, partition: int, slot: int, checkpoint: bool = False, for_commit: bool = False) -> Future:
        """Queue ``_write``; its copy from the GPU waits for the kernels launched so far (they update the
        slot), marked now on the caller's stream."""
        trained = None
        if self._copy_streams is not None:
            trained = torch.cuda.Event()
            trained.record(torch.cuda.current_stream(self.device))
        return self._writer.submit(self._write, partition, slot, checkpoint, trained, for_commit)

    def _write(self, partition: int, slot: int, checkpoint: bool = False,
               trained: torch.cuda.Event | None = None, for_commit: bool = False) -> None:
        """Write a slot's partition (``checkpoint``: a resident one, for a commit; counted apart from the
        ordering's write-backs, which the simulator predicts). ``for_commit`` (checkpoints and the epoch's
        final write-backs): the files' digests are taken from memory meanwhile (``ChunkFiles.write``)."""
        for_commit = for_commit or checkpoint
        rows, nbytes = self._slot_rows(slot), 0
        for files, host, table in zip(self.files, self._host, self.tables):
            if table is not host:
                with self._on_copy_stream():
                    if trained is not None:
                        torch.cuda.current_stream(self.device).wait_event(trained)
                    host[rows].copy_(table[rows])
            nbytes += files.write(partition, raw_bytes(host[rows]), for_commit=for_commit)
        if checkpoint:
            self.counters.add_checkpoint_write(nbytes)
        else:
            self.counters.add_write(nbytes)

    def _evict(self, partition: int, for_commit: bool = False) -> None:
        """Free the partition's slot, writing it back behind if it is dirty (a clean one is in the store)."""
        slot = self._slot_of.pop(partition)
        if partition in self._dirty:
            self._dirty.discard(partition)
            future = self._submit_write(partition, slot, for_commit=for_commit)
        else:
            future = Future()
            future.set_result(None)
        self._slot_writes[slot] = self._partition_writes[partition] = future
        self._free.append(slot)

    # ---- walking the states ----
    def _view(self, index: int, partitions: Sequence[int]) -> BufferView:
        slot_of = torch.full((self.num_partitions,), -1, dtype=torch.long)
        ranges = []
        for partition in sorted(partitions):
            slot = self._slot_of[partition]
            slot_of[partition] = slot
            start, end = partition_bounds(self.store.num_nodes, self.num_partitions, partition)
            ranges.append((slot * self.stride, end - start))
        return BufferView(index, tuple(partitions), slot_of, self.rows, self.stride, ranges, ranges)

    def walk(self, states: Sequence[Sequence[int]],
             following: Callable[[], Sequence[int] | None] | None = None) -> Iterator[BufferView]:
        """Yield a view per state (the storage partitions resident in it).

        Admissions of the next states are read while this one trains, and, while the last states train,
        those of the next walk's first state (``following()``, asked for then; None: no walk follows) into the
        spare slots; evictions are written back behind. The partitions of the last state stay resident (and
        dirty): the next walk starts from them; ``write_resident()`` or ``flush()`` puts them in the store.
        """
        self._enter(sorted(states[0]))
        planned, count = list(states), len(states)  # (then the next walk's first state, once asked for)

        def schedule(index: int) -> None:
            nonlocal following
            if following is not None and index + self.lookahead >= count:
                upcoming, following = following(), None
                if upcoming is not None:
                    planned.append(tuple(upcoming))
            self._schedule(planned, index)
        schedule(0)
        yield self._trained(0, states[0])
        for index in range(1, count):
            previous, current = set(states[index - 1]), set(states[index])
            if len(current - previous) > self.swap_size or len(current) != len(previous):
                raise ValueError(f"state {index} swaps {len(current - previous)} partitions; the buffer swaps "
                                 f"at most {self.swap_size} and keeps {self.capacity} resident")
            for partition in sorted(previous - current):
                self._evict(partition)
            for partition in sorted(current - previous):
                self._admit(partition)
            schedule(index)
            yield self._trained(index, states[index])
        self._wait_for_writes()  # (the walk's write-backs are in the store, and its counters, when it ends)

    def _wait_for_writes(self) -> None:
        for future in list(self._slot_writes.values()):
            future.result()

    def _trained(self, index: int, partitions: Sequence[int]) -> BufferView:
        """The view of a state about to be trained: its partitions become dirty."""
        self._dirty.update(partitions)
        return self._view(index, partitions)

    def _admit(self, partition: int, fetch: Fetch | None = None) -> None:
        slot, future = self._scheduled.pop(partition, (None, None))
        if future is None:  # not read ahead: read it now (a fetch after those asked before it)
            slot = self._free.pop(0)
            if fetch is None:
                nbytes = self._read(partition, slot)
            else:
                nbytes = self._receiver.submit(self._read, partition, slot, fetch).result()
        else:
            nbytes = future.result()
        if nbytes is not None:
            self.counters.add_read(nbytes)
        self._slot_of[partition] = slot

    def _schedule(self, states: Sequence[Sequence[int]], index: int) -> None:
        """Read ahead the admissions of states ``index + 1 .. index + lookahead`` into free slots.

        A partition resident now is not read ahead: its file is stale until it
        is evicted; it is read when its turn comes.
        """
        resident = set(states[index])
        for later in range(index + 1, min(len(states), index + 1 + self.lookahead)):
            for partition in sorted(set(states[later]) - set(states[later - 1])):
                if partition in self._scheduled or partition in resident or not self._free:
                    continue
                self._read_ahead(partition)

    def _enter(self, partitions: list[int]) -> None:
        """The first state of a walk: resident partitions it holds stay, the others are evicted, and the
        missing ones are read (in partition order), but for those the walk before read ahead for it."""
        if len(partitions) > self.capacity:
            raise ValueError(f"a state holds {len(partitions)} partitions, capacity is {self.capacity}")
        self._drop_read_ahead(keep=set(partitions))  # (reads an abandoned walk left in flight)
        for partition in sorted(set(self._slot_of) - set(partitions)):
            self._evict(partition)
        for partition in partitions:
            if partition not in self._slot_of:
                self._admit(partition)

    def _drop_read_ahead(self, keep: set[int] = frozenset()) -> None:
        """Wait for the reads ahead not admitted (but those of ``keep``) and free their slots (they are
        unmodified); their bytes were read all the same, and count."""
        for partition in [p for p in self._scheduled if p not in keep]:
            slot, future = self._scheduled.pop(partition)
            nbytes = future.result()
            if nbytes is not None:
                self.counters.add_read(nbytes)
            self._free.append(slot)

    @property
    def resident(self) -> list[int]:
        """The partitions in the buffer now."""
        return sorted(self._slot_of)

    def hold(self, partitions: Sequence[int], fetches: Mapping[int, Fetch] | None = None) -> BufferView:
        """Make ``partitions`` resident, reading those that are not (nor ``prefetch``ed), for a trainer handed
        one bucket at a time (several trainers, no ordering known ahead); what it no longer needs it
        ``release``s first. ``fetches``: partitions that come from elsewhere than the store, each with the
        function that fills its slot's rows (one tensor per table) and returns the bytes it moved."""
        wanted = sorted(set(partitions))
        if len(set(self._slot_of) | set(wanted)) > self.capacity:
            raise ValueError(f"holding {wanted} beside {sorted(self._slot_of)} exceeds capacity {self.capacity}")
        for partition in wanted:
            if partition not in self._slot_of:
                self._admit(partition, (fetches or {}).get(partition))
        return self._trained(0, wanted)

    def prefetch(self, partitions: Sequence[int], fetches: Mapping[int, Fetch] | None = None) -> None:
        """Start reading ``partitions`` into spare slots behind training, for a later ``hold`` (a trainer
        told its next bucket while it trains the last); ``fetches`` as for ``hold``. Each must be in the
        store or fetched: a resident one is not read ahead, and with no spare slot left the rest are read by
        ``hold``."""
        for partition in sorted(set(partitions) - set(self._slot_of) - set(self._scheduled)):
            if not self._free:
                return
            self._read_ahead(partition, (fetches or {}).get(partition))

    def _read_ahead(self, partition: int, fetch: Fetch | None = None) -> None:
        slot = self._free.pop(0)
        pool = self._reader if fetch is None else self._receiver
        self._scheduled[partition] = (slot, pool.submit(self._read, partition, slot, fetch))

    def release(self, partitions: Sequence[int]) -> list[Future]:
        """Drop ``partitions``, writing them back behind: the futures are done once they are in the store
        (another trainer may then read them). A slot takes a new partition only after its write-back."""
        for partition in sorted(partitions):
            self._evict(partition)
        return [self._partition_writes[partition] for partition in partitions]

    def write_resident(self) -> None:
        """Write every dirty resident partition to the store, keeping it resident (now clean), and wait for every
        write-back: the store then holds the tables as they are (a commit, an evaluation)."""
        pending = [self._submit_write(partition, slot, True) for partition, slot in sorted(self._slot_of.items())
                   if partition in self._dirty]
        self._dirty.clear()  # (every dirty partition is resident: evictions take theirs out)
        for future in pending:
            future.result()
        self._wait_for_writes()

    def flush(self) -> None:
        """Empty the buffer: write every dirty resident partition back and wait for all IO.

        Partitions read ahead but not admitted are dropped (they are unmodified).
        """
        self._drop_read_ahead()
        for partition in sorted(self._slot_of):
            self._evict(partition, for_commit=True)  # (a commit may follow)
        self._wait_for_writes()
        self._slot_writes, self._partition_writes = {}, {}

    def close(self) -> None:
        self._reader.shutdown(wait=True)
        self._receiver.shutdown(wait=True)
        self._writer.shutdown(wait=True)
