"""The run's commits: which version a run continues from, when the next is due, what one holds, and
making one the live state again (``marius_py/checkpoint.py`` holds the files and their protocol).

The trainer hands the checkpointer values (its run directory, its group, its fingerprint, the stored dtype,
what decides an epoch's walk) and asks it: the version to continue from (or to start a new run), whether a
commit is due, to commit (now or behind training), and to restore a version or a position inside an epoch.

Commits are written behind training where one process trains (``commit_behind``): at a commit point the
trainer takes a snapshot of what the version holds (tables in memory: a copy of them; out of core: the
live store's files hard-linked into the version, which later write-backs replace by rename, never
rewrite), and a thread writes it, digests and fsyncs it and swaps the pointer while the next epoch trains.
At most one commit is in flight: a commit point that comes while one is writing is folded into the next.
The pointer swap comes last, so a kill at any instant leaves the last committed version intact. A failure
of the thread is raised on the training thread at its next check (``finished``), never swallowed.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from marius_py.checkpoint import (LIVE_STORE, NODES, RunDirectory, RunFingerprint, TrainingState, check_holders,
                                  load_position, load_version, write_version_state)
from marius_py.errors import MariusInputError
from marius_py.group import TrainerGroup
from marius_py.random_streams import device_names
from marius_py.storage.durable import fsync_tree, reporting_full_disk
from marius_py.storage.embedding_store import EmbeddingStore, link_tree


@dataclass(frozen=True)
class Walk:
    """What decides which edges buffer state k of an epoch trains: a resume inside the epoch must match."""

    seed: int
    ordering: str
    num_partitions: int
    buffer_capacity: int
    group_size: int
    edge_assignment: str
    continues: bool = False  # (storage.continue_epochs)

    def key(self, epoch: int, num_states: int) -> str:
        walk = {"epoch": epoch, "seed": self.seed, "ordering": self.ordering, "partitions": self.num_partitions,
                "buffer": self.buffer_capacity, "group_size": self.group_size,
                "edge_assignment": self.edge_assignment, "states": num_states}
        if epoch > 1 and self.continues:  # (the epoch continues the one before: ``layout.epoch_ordering``)
            walk["continues"] = True
        return json.dumps(walk, sort_keys=True)


def read_version(version: Path, fingerprint: RunFingerprint, stored_dtype: str, num_trainers: int,
                 ) -> tuple[dict, TrainingState]:
    """A committed version's model state and training state (its node tables stay in its store), refused
    before anything is read when it was written for another model, dataset or storage dtype, or spread over
    more trainers' directories than ``num_trainers``: what a resume and ``load_checkpoint`` share."""
    _check_stored_dtype(version, stored_dtype)
    _, _, model_state, state = load_version(version, fingerprint, with_nodes=False)
    check_holders(state, num_trainers, version)
    return model_state, state


def _check_stored_dtype(version: Path, stored_dtype: str) -> None:
    """Refuse, by name, a ``storage.dtype`` other than the run's (the fingerprint would refuse it unnamed)."""
    try:
        stored = EmbeddingStore(version / NODES, mode="r").dtype
    except (OSError, ValueError, KeyError):
        return  # a damaged version: load_version reports it
    if stored != getattr(torch, stored_dtype):
        name = str(stored).removeprefix("torch.")
        raise MariusInputError(f"the run stores {name} embeddings; this config has storage.dtype={stored_dtype}",
                               path=version, expected=f"storage.dtype={name} (a run keeps the dtype it started with)")


@dataclass
class Snapshot:
    """What a version holds, taken at a commit point on the training thread: the model's and the training
    state's copies, and the tables in memory (copies the thread writes into the live store first; None:
    the live store is current, out of core)."""

    model_state: dict
    state: TrainingState
    is_best: bool
    held_partitions: list[int] | None
    tables: tuple[torch.Tensor, torch.Tensor] | None = None
    taken: float = field(default_factory=time.perf_counter)


@dataclass
class Finished:
    """A commit the thread completed: the version, the epoch it holds, its seconds off the training
    thread, and the commit points folded into it."""

    version: Path
    epoch: int
    seconds: float
    folded: list[int]


class Checkpointer:
    """Commits, restores and positions of one trainer's run directory (a group's trainers commit together)."""

    def __init__(self, run: RunDirectory, group: TrainerGroup, fingerprint: RunFingerprint, stored_dtype: str,
                 interval: float, walk: Walk):
        """``interval``: ``training.checkpoint_interval`` seconds (0: every epoch); ``walk``: the epoch walk's
        settings, which a version committed inside an epoch records."""
        self.run, self.group, self.fingerprint = run, group, fingerprint
        self.stored_dtype, self.interval, self.walk = stored_dtype, interval, walk
        self.position: dict | None = None  # where inside an epoch the restored version was committed
        self._last_commit = time.monotonic()
        self._writer: ThreadPoolExecutor | None = None  # (one thread, made at the first commit behind)
        self._in_flight: Future | None = None
        self._done: list[Finished] = []  # completed on the thread, not yet asked for (``finished``)
        self._folded: list[int] = []  # commit points folded into the commit after the one in flight

    @property
    def live_store_path(self) -> Path:
        return self.run.path / LIVE_STORE

    # ---- opening ----
    def version_to_continue(self) -> Path | None:
        """The version the run continues from (a group's: the one its leader's pointers name, which every
        trainer restores), or None for a new run; the leader first repairs lost pointers and checks the log."""
        latest = None
        if self.group.is_leader:
            repaired = self.run.repair_pointers()  # a lost or damaged pointer file, recovered from the versions
            if repaired:
                print(f"marius-py: {repaired}", file=sys.stderr)
            self.run.metric_lines()  # a damaged log line is refused (file:line) before the live store is rebuilt
            latest = self.run.latest_version().name if self.run.has_checkpoint() else None
        latest = self.group.broadcast(latest)
        if latest is not None:
            return self.run.adopt_version(latest)
        if not self.group.is_leader:  # (versions written for a commit the leader never made)
            self.run.drop_versions()
        return None

    def start_new(self) -> TrainingState:
        """A new run's (or one killed before its first commit): nothing committed, no position."""
        self.run.checkpoints.mkdir(parents=True, exist_ok=True)
        self.position = None
        self._last_commit = time.monotonic()  # (the interval counts from the start of training)
        return self.fingerprint.stamp(TrainingState())

    def restore(self, version: Path, dataset_directory: Path) -> tuple[dict, TrainingState]:
        """Make ``version``'s store files the live store (hard links: no copy); its model state and training
        state, and its position inside an epoch (``position``)."""
        model_state, state = read_version(version, self.fingerprint, self.stored_dtype, self.group.world_size)
        if state.dataset_identity is None and self.group.is_leader:
            print(f"marius-py: note: {version.name} predates dataset identities, so only the dataset's counts were "
                  f"compared; if {dataset_directory} was preprocessed again since (same counts, other ids), "
                  "stop now: the next commit records its identity and replaces this version", file=sys.stderr)
        self.position = load_position(version)
        self._last_commit = time.monotonic()
        shutil.rmtree(self.live_store_path, ignore_errors=True)
        link_tree(version / NODES, self.live_store_path)
        return model_state, self.fingerprint.stamp(state)  # (a version from before identities: later ones record it)

    # ---- when ----
    def due(self, is_best: bool, last: bool) -> bool:
        """Whether an epoch's end commits: every epoch, or per the interval (a new best and the last epoch
        always commit: the best version is what testing loads)."""
        return is_best or last or time.monotonic() - self._last_commit >= self.interval

    def due_between_states(self) -> bool:
        """Whether to commit between two buffer states: once the interval has passed (0: never)."""
        return self.interval > 0 and time.monotonic() - self._last_commit >= self.interval

    # ---- committing behind training ----
    @property
    def writing(self) -> bool:
        """Whether a commit is in flight."""
        return self._in_flight is not None and not self._in_flight.done()

    def on_writer(self, work: Callable[[], object]) -> Future:
        """Run ``work`` on the writer thread (before any commit asked later): preparation that may take
        seconds, kept off the training thread."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="commit")
        return self._writer.submit(work)

    def fold(self, epoch: int) -> None:
        """Skip this commit point: the one in flight still writes (the next commit holds this epoch's work)."""
        self._folded.append(epoch)

    def commit_behind(self, take_snapshot: Callable[[], Snapshot], store: EmbeddingStore) -> None:
        """Write the snapshot ``take_snapshot`` takes as the next version on the writer thread, once the commit
        in flight, if any, is done (a snapshot may reuse its memory). ``store``: the live store the tables
        of a snapshot in memory are written into; out of core, its files are linked into the version now,
        on the training thread: the snapshot."""
        self.wait()
        self._last_commit = time.monotonic()  # (the interval counts from the snapshot: a folded point does not)
        snapshot = take_snapshot()
        tmp = None
        if snapshot.tables is None:
            tmp = self.run.begin_version(snapshot.state.epoch, snapshot.state.states_done)
            link_tree(self.live_store_path, tmp / NODES, partitions=snapshot.held_partitions)
        folded, self._folded = self._folded, []
        self._in_flight = self.on_writer(lambda: self._write_behind(snapshot, store, tmp, folded))

    def _write_behind(self, snapshot: Snapshot, store: EmbeddingStore, tmp: Path | None,
                      folded: list[int]) -> Finished:
        """On the writer thread. A full disk is one ``DiskFullError`` naming the run directory and the bytes
        the tables need (the hidden version it half-wrote is removed by the next commit or start)."""
        needed = sum(table.nbytes for table in snapshot.tables) if snapshot.tables is not None else None
        with reporting_full_disk(f"committing epoch {snapshot.state.epoch} behind training", self.run.path, needed):
            if snapshot.tables is not None:
                store.write_all(*snapshot.tables)
            version = self._write_version(snapshot.model_state, snapshot.state, snapshot.is_best,
                                          snapshot.held_partitions, None, tmp)  # (epoch ends only)
        return Finished(version, snapshot.state.epoch, time.perf_counter() - snapshot.taken, folded)

    def finished(self) -> list[Finished]:
        """The commits the writer thread completed since the last call (a failure of the thread raised here)."""
        self._collect()
        done, self._done = self._done, []
        return done

    def wait(self) -> None:
        """Wait for the commit in flight (its failure raised here; ``finished`` then gives it)."""
        if self._in_flight is not None:
            self._in_flight.exception()  # (waits)
        self._collect()

    def _collect(self) -> None:
        if self._in_flight is not None and self._in_flight.done():
            future, self._in_flight = self._in_flight, None
            self._done.append(future.result())

    def close(self) -> None:
        """Let the commit in flight finish (a version fully written commits; a failure is left to the error
        already being raised) and stop the thread."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    # ---- committing ----
    def commit(self, model_state: dict, state: TrainingState, is_best: bool, held_partitions: list[int] | None,
               position: dict | None = None) -> Path:
        """Snapshot the (flushed) live store and ``model_state`` into a new committed version (``position``:
        where inside an epoch, for versions committed between buffer states); the version.

        A group commits together: every trainer writes its version (the partitions its store holds) under
        the version's final name; once all have, the leader's pointer file names it, which is the group's
        commit; then the others' pointers follow (a resume adopts a version a trainer wrote but had not
        pointed to yet: ``RunDirectory.adopt_version``)."""
        self.wait()
        self._folded = []  # (points folded since the last commit behind are in this version)
        if position is None:
            self._last_commit = time.monotonic()
        version = self._write_version(model_state, state, is_best, held_partitions, position)
        if position is not None:
            self._last_commit = time.monotonic()
        return version

    def _write_version(self, model_state: dict, state: TrainingState, is_best: bool,
                       held_partitions: list[int] | None, position: dict | None, tmp: Path | None = None) -> Path:
        """Snapshot the live store (unless ``tmp`` already links it) and the model into a committed version."""
        if tmp is None:
            fsync_tree(self.live_store_path)
            tmp = self.run.begin_version(state.epoch, state.states_done)
            link_tree(self.live_store_path, tmp / NODES, partitions=held_partitions)
        write_version_state(tmp, model_state, state, position)
        version = self.run.prepare_version(tmp, state.epoch, state.states_done)
        self.group.barrier()  # every trainer's version is on its disk
        if self.group.is_leader:
            self.run.point_to(version, is_best)
        self.group.barrier()  # the group has committed
        if not self.group.is_leader:
            self.run.point_to(version, False, keeps_best=False)
        return version

    # ---- inside an epoch ----
    def position_of(self, epoch: int, num_states: int, generators: list[torch.Generator]) -> dict:
        """Where the running epoch is, for a version committed between its buffer states."""
        return {"walk": self.walk.key(epoch, num_states), "devices": device_names(g.device for g in generators),
                "generators": [g.get_state() for g in generators]}

    def restore_position(self, epoch: int, num_states: int, generators: list[torch.Generator]) -> None:
        """Set the epoch's generators to a mid-epoch version's, refusing a walk or devices that differ."""
        position = self.position
        where = self.run.checkpoints
        if position is None:
            raise MariusInputError("a mid-epoch checkpoint lacks its position (position.pt)", path=where,
                                   expected="a version committed by `marius-py train`")
        if position["walk"] != self.walk.key(epoch, num_states):
            raise MariusInputError(f"the run was checkpointed inside epoch {epoch} with other storage settings "
                                   f"({position['walk']})", path=where,
                                   expected="--resume with the run's storage.* settings and seed")
        if device_names(position["devices"]) != device_names(g.device for g in generators):
            raise MariusInputError(f"the run was checkpointed inside epoch {epoch} with its random draws on "
                                   f"{position['devices']}; this run draws them on "
                                   f"{[str(g.device) for g in generators]}", path=where,
                                   expected="--resume on the same devices (training.device/devices); a "
                                            "mid-epoch version of a GPU run made before shuffles were drawn "
                                            "on the GPU (cpu first) resumes with the marius-py that made it")
        for generator, saved in zip(generators, position["generators"]):
            generator.set_state(saved)


def host_copy(value):
    """``value`` (a state dict: nested dicts and lists of tensors and numbers) with every tensor copied to the
    host: a snapshot's model state, which training goes on changing."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: host_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(item) for item in value)
    return value
