"""Partitions handed from trainer to trainer over torch.distributed: no shared file system.

A partition's latest copy is in the local store of the trainer that wrote it
last (``Holdings``). When the scheduler grants it to another trainer, the
holder's sender thread (``PartitionSender``) reads it from its store and
sends it; the receiver's buffer fills a slot with it (a buffer *fetch*,
``PartitionTransfer.fetch_from``). Both sides move a partition's tables whole
(the store's chunk of each: embeddings, then optimizer state) and in the
scheduler's order, so sends and receives pair up also where NCCL ignores tags.
At the epochs the leader evaluates, and at the last, every partition goes to
the leader's store (``gather_to_leader``), so that its run directory alone
holds the model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from marius_py.distributed.group import LEADER, Group
from marius_py.distributed.scheduler_service import SchedulerClient
from marius_py.storage.buffer import Fetch
from marius_py.storage.chunk_files import ChunkFiles, page_aligned_empty, raw_bytes, slot_rows
from marius_py.storage.embedding_store import EmbeddingStore


class Holdings:
    """Partitions whose latest copy is in this trainer's store: written by it, not yet sent on."""

    def __init__(self, partitions=()):
        self._held = set(partitions)
        self._lock = threading.Lock()

    def reset(self, partitions) -> None:
        with self._lock:
            self._held = set(partitions)

    def written(self, partitions) -> None:
        with self._lock:
            self._held |= set(partitions)

    def sent(self, partition: int) -> None:
        with self._lock:
            self._held.discard(partition)

    def snapshot(self) -> list[int]:
        with self._lock:
            return sorted(self._held)


def holders_of(holdings: list[list[int]], num_partitions: int) -> list[int]:
    """Partition -> the rank whose store has it, from every rank's holdings (by rank). Each partition must be
    held by exactly one rank: anything else is a lost or doubled update, raised."""
    holders = [-1] * num_partitions
    for rank, held in enumerate(holdings):
        for partition in held:
            if holders[partition] != -1:
                raise RuntimeError(f"partition {partition} is held by trainers {holders[partition]} and {rank}")
            holders[partition] = rank
    missing = [p for p, rank in enumerate(holders) if rank == -1]
    if missing:
        raise RuntimeError(f"partitions {missing} are held by no trainer")
    return holders


@dataclass
class TransferCounters:
    partitions_sent: int = 0
    bytes_sent: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.partitions_sent += 1
            self.bytes_sent += nbytes

    def snapshot(self) -> dict:
        with self._lock:
            return {"partitions_sent": self.partitions_sent, "bytes_sent": self.bytes_sent}


class PartitionTransfer:
    """This trainer's end of the partition links: partitions sent from its live store, received into a buffer's
    slot or into its store. ``store``: the live store now (a resume replaces it); ``device``: where the tables
    live (a GPU's: NCCL moves the partitions there)."""

    def __init__(self, group: Group, store: Callable[[], EmbeddingStore], device: Callable[[], torch.device]):
        self.group, self.store, self._device = group, store, device
        self.counters = TransferCounters()
        self._staging: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # (host, device) per table
        self._staging_lock = threading.Lock()  # (the sender thread and the gather share it)
        self._stream = None

    @property
    def device(self) -> torch.device:
        return self._device()

    def _files(self) -> tuple[ChunkFiles, ChunkFiles]:
        return self.store().chunk_files(direct=False)

    def _staged(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One partition's tables in page-aligned host memory (pinned with a GPU) and, on a GPU, their device
        copies: what NCCL sends from and receives into."""
        if self._staging is None:
            staging = []
            for files in self._files():
                rows = slot_rows(files.rows_per_chunk, files.cols, itemsize=files.itemsize)
                host = page_aligned_empty(rows, files.cols, self.device.type == "cuda", files.dtype)
                on_device = host if self.device.type == "cpu" else torch.empty_like(host, device=self.device)
                staging.append((host, on_device))
            self._staging = staging
        return self._staging

    @contextmanager
    def _on_own_stream(self):
        """On a GPU, this thread's work on the device and a stream of the transfer's own (not queued behind
        training on the default stream)."""
        if self.device.type != "cuda":
            yield
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            yield
            self._stream.synchronize()

    def send(self, partition: int, destination: int) -> int:
        """Send ``partition`` from this trainer's store to ``destination``; the bytes sent."""
        nbytes = 0
        with self._staging_lock, self._on_own_stream():
            for files, (host, on_device) in zip(self._files(), self._staged()):
                files.read_into(partition, raw_bytes(host))
                rows = on_device[:files.rows_per_chunk]
                if on_device is not host:
                    rows.copy_(host[:files.rows_per_chunk])
                dist.send(rows, dst=destination, group=self.group.link_to(destination))
                nbytes += files.chunk_bytes
        self.counters.add(nbytes)
        return nbytes

    def fetch_from(self, source: int) -> Fetch:
        """A buffer fetch: the slot's tables received from ``source`` (on the buffer's fetch thread)."""
        def receive(tables: list[torch.Tensor]) -> int:
            for table in tables:
                dist.recv(table, src=source, group=self.group.link_from(source))
            if self.device.type == "cuda":  # (the slot is trained on other streams)
                torch.cuda.current_stream(self.device).synchronize()
            return sum(t.numel() * t.element_size() for t in tables)
        return receive

    def receive_into_store(self, partition: int, source: int) -> int:
        """Receive ``partition`` from ``source`` and write it to this trainer's store, for a commit."""
        nbytes = 0
        with self._staging_lock, self._on_own_stream():
            for files, (host, on_device) in zip(self._files(), self._staged()):
                rows = on_device[:files.rows_per_chunk]
                dist.recv(rows, src=source, group=self.group.link_from(source))
                if on_device is not host:
                    host[:files.rows_per_chunk].copy_(rows)
                nbytes += files.write(partition, raw_bytes(host), for_commit=True)
        return nbytes


def gather_to_leader(group: Group, transfer: PartitionTransfer, holders: list[int]) -> int:
    """Every partition held elsewhere sent to the leader's store, in partition order (each pair of trainers
    sends and receives in that order); returns the bytes this trainer sent or received."""
    moved = 0
    for partition, holder in enumerate(holders):
        if holder == LEADER:
            continue
        if group.rank == holder:
            moved += transfer.send(partition, LEADER)
        elif group.is_leader:
            moved += transfer.receive_into_store(partition, holder)
    return moved


class PartitionSender:
    """The thread that carries out this trainer's send orders of an epoch, in their order."""

    def __init__(self, client: SchedulerClient, transfer: PartitionTransfer, holdings: Holdings):
        self.client, self.transfer, self.holdings = client, transfer, holdings
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start_epoch(self, epoch: int) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(epoch,), name="partition-sender", daemon=True)
        self._thread.start()

    def _run(self, epoch: int) -> None:
        try:
            number = 0
            while (order := self.client.next_send(epoch, number, self._check_stop)) is not None:
                self.transfer.send(order.partition, order.destination)
                self.holdings.sent(order.partition)
                number += 1
        except BaseException as error:  # noqa: BLE001 - raised to the training thread by check / finish
            self.error = error

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise RuntimeError("stopped")

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"sending partitions to other trainers failed: {self.error!r}") from self.error

    def finish(self) -> None:
        """Until every send order of the epoch is carried out (the scheduler has granted every bucket)."""
        if self._thread is not None:
            self._thread.join()
        self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
