"""One trainer of several: buckets from rank 0's scheduler, partitions through the shared store.

As PyTorch-BigGraph's trainers: each holds the partitions of the bucket it was
granted (and keeps up to ``distributed.partitions_per_trainer`` of those it
held), trains the bucket's edges (with every other bucket left among the same
partitions, in one shuffled span) with negatives from them, and writes a
partition back to the shared store before the scheduler lets another trainer
read it, so no update is lost. While a span trains, a thread asks for the next
grant and reads its new partitions into spare slots, so partition reads
overlap training as a buffer's prefetch does. Every trainer's relation updates
reach the others (``relations.RelationExchange``). Rank 0 also runs the
scheduler, validates, commits the group's checkpoint and writes the metrics;
every epoch ends with all trainers at one barrier, so a checkpoint is the
state of the whole group.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path


from marius_py.checkpoint import RunDirectory, TrainingState
from marius_py.config import with_split_applied
from marius_py.run_log import read_json_lines
from marius_py.errors import MariusInputError
from marius_py.distributed.group import Group
from marius_py.distributed.relations import RelationExchange
from marius_py.distributed.scheduler_service import SchedulerClient, SchedulerServer
from marius_py.orderings.scheduler import Grant
from marius_py.distributed.write_backs import WriteBacks
from marius_py.resources import total_memory
from marius_py.trainer import Trainer, tf32_matmuls
from marius_py.storage.buffer import PartitionBuffer

DISTRIBUTED_DIR = "distributed"  # in the run directory: the scheduler's log, each trainer's holds


class _Discarded(list):
    def append(self, item) -> None:
        pass


class FollowerRunDirectory(RunDirectory):
    """Ranks > 0 read the run directory; rank 0 alone writes it (metrics, config, trackers, versions)."""

    def __init__(self, path):
        super().__init__(path)
        self.trackers = _Discarded()

    def create(self, config) -> None:
        pass

    def write_config(self, config) -> None:
        pass

    def log(self, record: dict) -> None:
        pass

    def truncate_metrics(self, epoch: int) -> None:
        pass

    def repair_pointers(self) -> None:
        return None  # (rank 0 repaired a damaged pointer file before the others started)

    def begin_version(self, epoch: int, states_done: int = 0) -> Path:
        raise AssertionError("only rank 0 commits versions")


class DistributedTrainer(Trainer):
    def __init__(self, config, dataset, run_dir, group: Group, progress: bool = True):
        if config.storage.dtype == "bfloat16":
            raise MariusInputError(f"storage.dtype={config.storage.dtype}: torchrun trainers exchange float32 "
                                   "partitions", path=Path(run_dir) / "config.yaml",
                                   expected="storage.dtype=float32 under torchrun")
        if config.storage.num_partitions == 1:
            raise MariusInputError(f"storage.num_partitions={config.storage.num_partitions}: torchrun trainers "
                                   "share the tables by partition", path=Path(run_dir) / "config.yaml",
                                   expected="storage.num_partitions of at least 2 under torchrun (2 per trainer "
                                            "or more keeps them busy), or 0 for the plan's choice")
        self.group = group
        self.holds_log = Path(run_dir) / DISTRIBUTED_DIR / f"rank{group.rank}.jsonl"
        super().__init__(config, dataset, run_dir, progress=progress and group.is_leader)
        scheduler_log = Path(run_dir) / DISTRIBUTED_DIR / "scheduler.jsonl"
        self._forget_epochs_after(self.state.epoch, [self.holds_log] + ([scheduler_log] if group.is_leader else []))
        config = self.config  # (the plan's partitions applied)
        self.server = SchedulerServer(group.store_connection(), config.storage.num_partitions, config.training.seed,
                                      scheduler_log, self._capacity()) if group.is_leader else None
        alive = self.server.check if self.server else None
        self.client = SchedulerClient(group.store_connection(), group.rank, alive=alive)
        self.ahead_client = SchedulerClient(group.store_connection(), group.rank, alive=alive, channel="ahead")
        self._asking_ahead = ThreadPoolExecutor(1, thread_name_prefix="grant-ahead")
        self.write_backs = WriteBacks(SchedulerClient(group.store_connection(), group.rank, alive=alive,
                                                      channel="write-back"), self.holds_log)
        self.waits = {"bucket": 0.0, "read": 0.0, "write_back": 0.0}  # seconds this epoch, by what it waited for
        self.relations = RelationExchange(self.model.relation_parameters(), group.control, group.world_size,
                                         config.distributed.relation_sync_seconds)
        self.buckets_trained = 0

    # ---- the run directory: rank 0 creates and restores it, the others open what it made ----
    def _run_directory(self, run_dir) -> RunDirectory:
        return RunDirectory(run_dir) if self.group.is_leader else FollowerRunDirectory(run_dir)

    @staticmethod
    def _forget_epochs_after(epoch: int, logs: list[Path]) -> None:
        """Drop log lines of epochs after the checkpoint (a resume trains them again), and a last line a kill
        cut short; a damaged line elsewhere is refused with the file and line."""
        for log in logs:
            if log.exists():
                kept = [record for _, record in read_json_lines(log) if record.get("epoch", 0) <= epoch]
                log.write_text("".join(json.dumps(record) + "\n" for record in kept))

    def _start_new_run(self) -> None:
        if self.group.is_leader:
            super()._start_new_run()
        else:
            self.state, self._position = TrainingState(config_fingerprint=self.fingerprint), None
            self._open_live(self.model.state_dict())

    def _link_live_store(self, version: Path) -> None:
        if self.group.is_leader:
            super()._link_live_store(version)

    def _capacity(self) -> int:
        return min(self.config.distributed.partitions_per_trainer, self.config.storage.num_partitions)

    def partition_buffer(self) -> PartitionBuffer:
        """``distributed.partitions_per_trainer`` slots, and as many spare: the next grant (asked while a
        span trains) is read into them while the last grant's partitions are written back (``lookahead=1``
        only sizes the spares; the trainer prefetches the grant's partitions itself)."""
        if self.buffer is None:
            capacity = self._capacity()
            self.buffer = PartitionBuffer(self.store, capacity, self.table_device, swap_size=capacity,
                                          lookahead=1, pin_memory=self._zero_copy_tables(),
                                          direct_io=self._direct_io(), io_threads=self.config.storage.io_threads)
        return self.buffer

    def _direct_io(self) -> bool:
        if self.config.storage.direct_io != "auto":
            return super()._direct_io()
        store_bytes = sum(f.chunk_bytes for f in self.store.chunk_files()) * self.store.num_partitions
        local = os.environ.get("LOCAL_WORLD_SIZE")  # (torchrun's; without it, not known to be one machine)
        return not page_cache_suits(store_bytes, self.group.world_size, int(local) if local else None,
                                    total_memory())

    def _buffer_bytes(self) -> int:
        """``partition_buffer``'s: as many spare slots as held ones."""
        capacity = self._capacity()
        return PartitionBuffer.bytes_needed(*self._partition_shape(), capacity, capacity, 1)

    def _state_commit_due(self) -> bool:
        return False  # the group commits at epoch ends only

    # ---- an epoch: granted buckets as spans ----
    def train_epoch(self, epoch: int) -> dict:
        self.relations.start_epoch()
        self.buckets_trained, rounds_before = 0, self.relations.rounds
        self.waits = dict.fromkeys(self.waits, 0.0)
        record = super().train_epoch(epoch)
        self.relations.finish_epoch()
        record["buckets"] = self.buckets_trained
        record["waits"] = {f"{what}_seconds": seconds for what, seconds in self.waits.items()}
        record["direct_io"] = self.partition_buffer().files[0].direct
        # all-reduce rounds of the relation parameters (each moves them once, plus the epoch's final one)
        record["relation_rounds"] = self.relations.rounds - rounds_before + 1
        return record

    def _spans(self, epoch: int, first_state: int = 0, ordering=None):
        buffer = self.partition_buffer()
        held_since: dict[int, float] = {}
        ahead: Future | None = None  # the next grant, asked (and its partitions read) while a span trains
        while True:
            if self.server is not None:
                self.server.check()
            self._between_buckets()
            with self._waiting("bucket"):
                grant = ahead.result() if ahead is not None else None
                if grant is None:
                    grant = self.client.acquire(epoch, between_tries=self._between_buckets)
            if grant.write_back:
                self._release(epoch, buffer, grant.write_back, held_since)
            if grant.bucket is None:
                if grant.finished:
                    break
                ahead = None
                continue
            for partition in grant.read:
                held_since.setdefault(partition, time.time())  # (a grant asked ahead set it at its read)
            with self._waiting("read"):  # the bucket's partitions and those kept: negatives from all
                view = buffer.hold(sorted(held_since))
            self.buckets_trained += len(grant.buckets)
            span = self._buffer_span(view, self.dataset.edges.buckets(grant.buckets))
            ahead = self._asking_ahead.submit(self._ask_ahead, epoch, buffer, held_since)
            yield span, buffer.embeddings, buffer.state
        if held_since:  # (the finishing grant wrote everything back)
            self._release(epoch, buffer, sorted(held_since), held_since)
        with self._waiting("write_back"):  # every partition is in the store before the epoch's barrier
            self.write_backs.wait()

    def _ask_ahead(self, epoch: int, buffer: PartitionBuffer, held_since: dict) -> Grant | None:
        """On the ahead thread while a span trains: the next grant, its new partitions prefetched (the
        training thread touches neither the buffer's books nor ``held_since`` until this returns). None:
        no bucket is free now; the training thread asks again once its span is done."""
        grant = self.ahead_client.acquire(epoch, ahead=True)
        if grant.bucket is None and not grant.finished:
            return None
        for partition in grant.read:
            held_since[partition] = time.time()
        buffer.prefetch(grant.read)
        return grant

    def _between_buckets(self) -> None:
        """Nothing trains now: take the relations' last correction (a peer's exchange round waits for it)
        and raise a failed write-back."""
        self.relations.apply_pending()
        self.write_backs.check()

    @contextmanager
    def _waiting(self, what: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.waits[what] += time.perf_counter() - started

    def _release(self, epoch: int, buffer: PartitionBuffer, partitions, held_since: dict) -> None:
        """Write ``partitions`` back behind training; the scheduler hears of them once they are written."""
        self._synchronize()  # (the GPU's last updates of their rows are done before they are copied out)
        writes = buffer.release(partitions)
        self.write_backs.submit(epoch, {p: held_since.pop(p) for p in partitions}, writes)

    # ---- the group's epoch loop ----
    def _train(self):
        t = self.config.training
        if self.state.states_done:
            raise MariusInputError("the last checkpoint stopped inside an epoch (one process with "
                                   "training.checkpoint_interval); trainers of a group resume at epoch ends",
                                   path=self.run.path, expected="resume it with one process to the epoch's end")
        self.run.write_config(with_split_applied(self.config, self.layout))
        while self.state.epoch < t.epochs and not self.state.stopped_early:
            with tf32_matmuls(self.device.type == "cuda" and t.tf32):
                record = self.train_epoch(self.state.epoch + 1)
            self.state.epoch += 1
            records = self.group.all_gather(record)  # every trainer has written its partitions back
            if self.group.is_leader:
                record = combine_records(records)
                self._say(f"epoch {record['epoch']}: loss {record['loss']:.4f}, {record['edges_per_s']:,.0f} "
                          f"edges/s over {self.group.world_size} trainers, {record['seconds']:.1f} s")
                self._finish_epoch(record)
            self.state = self.group.broadcast(self.state)  # best epoch, early stopping
            self.group.barrier()  # the commit is complete before anyone trains on
        return self.state

    def stop_scheduler(self) -> None:
        self._asking_ahead.shutdown(wait=True)
        self.write_backs.close()
        if self.server is not None:
            self.server.stop()


def combine_records(records: list[dict]) -> dict:
    """One epoch record for the group: summed loss and IO, the slowest trainer's time, and per trainer
    its buckets, edges/s and partition bytes read and written (through the shared store)."""
    seconds = max(r["seconds"] for r in records)
    edges = sum(r["edges_per_s"] * r["seconds"] for r in records)
    io = {key: sum(r["io"][key] for r in records) for key in records[0]["io"]}
    return {"event": "epoch", "epoch": records[0]["epoch"], "loss": sum(r["loss"] for r in records),
            "seconds": seconds, "edges_per_s": edges / seconds, "io": io,
            "relation_rounds": records[0]["relation_rounds"],
            "trainers": [{"rank": rank, "buckets": r["buckets"], "seconds": r["seconds"],
                          "edges_per_s": r["edges_per_s"], "bytes_read": r["io"]["bytes_read"],
                          "bytes_written": r["io"]["bytes_written"], "waits": r["waits"],
                          "direct_io": r["direct_io"]}
                         for rank, r in enumerate(records)],
            "pipeline": records[0]["pipeline"]}


def page_cache_suits(store_bytes: int, world_size: int, local_world_size: int | None,
                     memory: int | None) -> bool:
    """``storage.direct_io=auto`` for trainers: partitions through the page cache when every trainer runs on
    this machine and the store takes at most a quarter of its memory (MemTotal: every trainer decides
    alike). Two H200 trainers on one disk: 1.91x one trainer that way, 1.45x with O_DIRECT (both waited
    on the disk; docs/design.md). Across machines, or with a larger store, O_DIRECT (not measured
    otherwise)."""
    return local_world_size == world_size and memory is not None and 4 * store_bytes <= memory


def worker_pid_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / DISTRIBUTED_DIR / f"rank{rank}.pid"


def write_pid(run_dir: Path, rank: int) -> None:
    """Each trainer's process id, for operators (and the failure test) to find a trainer."""
    path = worker_pid_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")

