"""Span sources: where the trainer's spans of edges, and the node rows they train, come from.

A span is the edges trained together (one buffer state, or one grant of
buckets) with the table rows they index. The trainer walks an epoch's spans
from its span source and owns everything else (the model, the runner, the
store, checkpoints, evaluation):

- ``WholeTables``: one process, tables in memory: one span of every edge.
- ``BufferWalk``: one process out of core: the partition buffer walks the
  epoch's ordering, a span per buffer state.
- ``marius_py.distributed.granted_spans.GrantedSpans``: a trainer of a
  torchrun group: buckets granted by the scheduler, partitions handed over
  between trainers.

A source also says which partitions of the store this process initialises and
holds (one process: all of them), gathers them where the run is evaluated,
and combines the trainers' epoch records; for one process those are the
identity. It is handed values (``SpanInputs``: the dataset, the live tables,
the layout, the devices), never the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol

import numpy as np
import torch

from marius_py.negatives import CandidateRows
from marius_py.orderings import Ordering
from marius_py.storage.buffer import BufferView, PartitionBuffer
from marius_py.storage.embedding_store import EmbeddingStore

if TYPE_CHECKING:
    from marius_py.checkpoint import RunFingerprint
    from marius_py.config import StorageConfig
    from marius_py.dataset import Dataset
    from marius_py.layout import StorageLayout

Span = tuple["TrainingSpan", torch.Tensor, torch.Tensor]  # (edges, embedding table, state table)


@dataclass
class TrainingSpan:
    """Edges trained together (one buffer state) and the node rows they index."""

    edges: torch.Tensor            # [E, 3] in table-local node rows (a buffer's: where the tables live)
    candidates: CandidateRows | None


@dataclass
class LiveTables:
    """The run's live node tables: its store on disk and, when they are held in memory, the tables themselves.
    The trainer replaces them when it restores a version; span sources read them as they are now."""

    store: EmbeddingStore | None = None
    nodes: torch.Tensor | None = None
    node_state: torch.Tensor | None = None


@dataclass(frozen=True)
class SpanInputs:
    """What a span source is handed by the trainer, instead of the trainer: its values, the live tables
    (which a restore replaces in place) and the one action it needs of the devices (``synchronize``)."""

    dataset: Dataset               # its edges (re-bucketed for the run's partitions when partitioned)
    tables: LiveTables
    layout: StorageLayout
    storage: StorageConfig         # lookahead, direct IO, IO threads, edge assignment
    seed: int
    plan_device: torch.device      # where batches are planned (a span's edges are mapped there)
    table_device: torch.device     # where the tables (or the buffer's slots) live
    pin_tables: bool               # the runner trains host tables in place: a buffer's slots are pinned
    run_path: Path
    fingerprint: RunFingerprint
    relation_parameters: list          # (a torchrun trainer exchanges them)
    synchronize: Callable[[], None]    # waits for the devices' queued work (before rows are copied out)
    # the storage partitions the epoch after the given one starts with (None: none follows), which a buffer
    # reads ahead while the epoch's last states train
    next_first_state: Callable[[int], Sequence[int] | None] = lambda epoch: None

    def partition_buffer(self, capacity: int, swap_size: int, lookahead: int) -> PartitionBuffer:
        """A partition buffer over the live store, as the storage settings ask."""
        s = self.storage
        return PartitionBuffer(self.tables.store, capacity, self.table_device, swap_size=swap_size,
                               lookahead=lookahead, pin_memory=self.pin_tables, direct_io=s.direct_io != "false",
                               io_threads=s.io_threads)


class SpanSource(Protocol):
    buffer: PartitionBuffer | None      # allocated on first use (evaluation and export never need it)
    commits_between_states: bool        # spans are an ordering's states, so a version may be committed between

    def partition_buffer(self) -> PartitionBuffer:
        """Its buffer, allocated on first use (the plan sized it: ``Plan.buffer_bytes``)."""

    def spans(self, epoch: int, first_state: int, ordering: Ordering | None) -> Iterator[Span]:
        """An epoch's spans, from ``first_state`` on (``ordering``: the epoch's, which a buffer walks; None in
        memory)."""

    def epoch_record(self) -> dict:
        """What the source adds to this process's epoch record."""

    def combine(self, records: list[dict]) -> dict:
        """The run's epoch record from every trainer's (by rank)."""

    def resumed(self, epoch: int, holders: list[int] | None) -> None:
        """The run's state is a committed version's (or a new run's): its last epoch, and which trainer held
        each partition (``TrainingState.holders``; None: one process holds them all)."""

    def holders(self) -> list[int] | None:
        """Which trainer holds each partition now, which a commit records (None: one process holds them all)."""

    def initial_partitions(self) -> list[int] | None:
        """Partitions a new run initialises in this process's store (None: all)."""

    def held_partitions(self) -> list[int] | None:
        """Partitions whose latest copy this process's store has, which its versions keep (None: all)."""

    def write_back(self) -> None:
        """Make this process's store current: what a commit snapshots and evaluation reads (a buffer keeps its
        partitions resident between epochs)."""

    def gather_for_evaluation(self) -> dict | None:
        """Bring every partition to the leader's store (evaluation and the run's last version read it); what
        moved, for the epoch's record (None: nothing can have)."""

    def close_buffer(self) -> None:
        """Release the buffer (a restore opens another store; the next span allocates it again)."""

    def close(self) -> None:
        """Release everything the source holds (after training, or when it failed)."""


SpanSourceFactory = Callable[[SpanInputs], SpanSource]


class OneProcessSpans:
    """What the sources of a run trained by one process share: it holds every partition."""

    buffer: PartitionBuffer | None = None
    commits_between_states = False

    def __init__(self, inputs: SpanInputs):
        self.inputs = inputs
        self._holders: list[int] | None = None

    def epoch_record(self) -> dict:
        return {}

    def combine(self, records: list[dict]) -> dict:
        (record,) = records
        return record

    def resumed(self, epoch: int, holders: list[int] | None) -> None:
        self._holders = holders  # (a group's run resumed by one process: check_holders saw them all at rank 0)

    def holders(self) -> list[int] | None:
        return self._holders

    def initial_partitions(self) -> list[int] | None:
        return None

    def held_partitions(self) -> list[int] | None:
        return None

    def write_back(self) -> None:
        pass  # (tables in memory are written by the commit; a buffer walk overrides this)

    def gather_for_evaluation(self) -> dict | None:
        return None

    def close_buffer(self) -> None:
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None

    def close(self) -> None:
        self.close_buffer()


class WholeTables(OneProcessSpans):
    """Tables in memory: every train edge in one span."""

    def __init__(self, inputs: SpanInputs):
        super().__init__(inputs)
        self._planned_edges: torch.Tensor | None = None

    def partition_buffer(self) -> PartitionBuffer:
        raise AssertionError("tables in memory have no partition buffer")

    def spans(self, epoch: int, first_state: int = 0, ordering: Ordering | None = None) -> Iterator[Span]:
        tables = self.inputs.tables
        yield TrainingSpan(self._train_edges(), None), tables.nodes, tables.node_state

    def _train_edges(self) -> torch.Tensor:
        """All train edges, kept in pinned host memory for every epoch when batches are planned on a GPU: each
        epoch's copy then runs at ~50 GB/s (from pageable memory it cost ~5% of a GPU epoch), and the GPU holds
        the edges only while an epoch shuffles them, not all run long beside its tables."""
        if self._planned_edges is None:
            edges = torch.from_numpy(self.inputs.dataset.train)
            self._planned_edges = edges.pin_memory() if self.inputs.plan_device.type == "cuda" else edges
        return self._planned_edges


class BufferWalk(OneProcessSpans):
    """Out of core: the partition buffer walks the epoch's ordering, a span per buffer state. Each state's
    edges are read while the state before it trains (h5py reads without holding the GIL)."""

    commits_between_states = True
    _staged: tuple[np.ndarray, np.ndarray] | None = None  # (``_staging``)
    _edge_reader: ThreadPoolExecutor | None = None

    def partition_buffer(self) -> PartitionBuffer:
        if self.buffer is None:
            layout = self.inputs.layout
            self.buffer = self.inputs.partition_buffer(layout.buffer_capacity, layout.swap_size,
                                                       self.inputs.storage.lookahead)
        return self.buffer

    def spans(self, epoch: int, first_state: int = 0, ordering: Ordering | None = None) -> Iterator[Span]:
        if ordering is None:
            raise ValueError("a buffer walks the epoch's ordering: pass it")
        i = self.inputs
        states = [ordering.resident(k) for k in range(ordering.num_states)]
        if first_state >= len(states):  # resumed after the epoch's last state: its work is in the store
            return
        if i.storage.edge_assignment == "edge":
            state_edges = self._edges_by_edge(states, epoch)
        else:  # (two staging arrays: state k reads into one while state k - 1's span copies out of the other)
            staging = self._staging(max(i.dataset.edges.count(buckets) for buckets in ordering.buckets))
            state_edges = lambda k: i.dataset.edges.read_buckets(ordering.buckets[k], staging[k % 2])  # noqa: E731
        if self._edge_reader is None:
            self._edge_reader = ThreadPoolExecutor(1, thread_name_prefix="state-edges")
        buffer = self.partition_buffer()
        upcoming = self._edge_reader.submit(state_edges, first_state)
        try:
            for view in buffer.walk(states[first_state:], following=lambda: i.next_first_state(epoch)):
                state = first_state + view.index
                edges = upcoming.result()
                if state + 1 < len(states):
                    upcoming = self._edge_reader.submit(state_edges, state + 1)
                yield (buffer_span(view, edges, i.plan_device), buffer.embeddings, buffer.state)
        finally:  # (a walk left early: no read may still fill a staging array the next walk reuses)
            wait([upcoming])
        # (the last state's partitions stay resident for the next epoch's walk: write_back() when the store
        # must be current)

    def write_back(self) -> None:
        if self.buffer is not None:
            self.buffer.write_resident()

    def _staging(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Two host arrays for states' edges, kept from state to state and grown when a state needs more
        (pinned when batches are planned on a GPU: the copy then runs at full speed)."""
        if self._staged is None or len(self._staged[0]) < rows:
            self._staged = None  # (the old ones freed first)
            pinned = self.inputs.plan_device.type == "cuda"
            self._staged = tuple(torch.empty((rows, 3), dtype=torch.int64, pin_memory=pinned).numpy()
                                 for _ in range(2))
        return self._staged

    def close(self) -> None:
        if self._edge_reader is not None:
            self._edge_reader.shutdown(wait=True)
            self._edge_reader = None
        super().close()

    def _edges_by_edge(self, states: list[tuple[int, ...]], epoch: int):
        """Edge-level assignment: each edge of bucket (i, j) goes to a random state holding i and j.

        Every state then trains a uniform mix of all the buckets it could train,
        instead of the whole buckets the ordering assigned to it. The draw is
        seeded by (seed, epoch, i, j), so each edge lands in exactly one state.
        """
        member = np.zeros((len(states), self.inputs.layout.num_partitions), dtype=bool)
        for k, state in enumerate(states):
            member[k, list(state)] = True
        seed, edge_store = self.inputs.seed, self.inputs.dataset.edges

        def state_edges(k: int) -> np.ndarray:
            pairs = sorted((i, j) for i in states[k] for j in states[k])
            parts = []
            for (i, j), edges in zip(pairs, edge_store.buckets(pairs)):
                eligible = np.flatnonzero(member[:, i] & member[:, j])
                draws = np.random.default_rng([seed, epoch, i, j]).integers(len(eligible), size=len(edges))
                parts.append(edges[eligible[draws] == k])
            return np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.int64)
        return state_edges


def buffer_span(view: BufferView, edges: np.ndarray, plan_device: torch.device) -> TrainingSpan:
    """``edges`` (buckets read from the edge store, int64 [E, 3]; a staging array's rows, free again once this
    returns) in the buffer's rows, with the resident rows as negatives."""
    # Mapped where the runner plans them (the GPU: no idle host work); the mapped copy is the span's own.
    edges = torch.from_numpy(edges).to(plan_device)
    local = torch.stack([view.local_ids(edges[:, 0]), edges[:, 1], view.local_ids(edges[:, 2])], dim=1)
    return TrainingSpan(local, CandidateRows(view.candidate_ranges, plan_device))
