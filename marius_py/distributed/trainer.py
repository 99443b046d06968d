"""One trainer of several: buckets from rank 0's scheduler, partitions through the shared store.

As PyTorch-BigGraph's trainers: each holds the partitions of the bucket it was
granted (and keeps up to ``distributed.partitions_per_trainer`` of those it held), trains the bucket's edges (with every other bucket left
among the same partitions, in one shuffled span) with negatives from them,
and writes a partition back to the shared store before the scheduler lets
another trainer read it, so no update is lost. Every trainer's relation updates
reach the others (``relations.RelationExchange``). Rank 0 also runs the
scheduler, validates, commits the group's checkpoint and writes the metrics;
every epoch ends with all trainers at one barrier, so a checkpoint is the
state of the whole group.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


from marius_py.checkpoint import RunDirectory, TrainingState
from marius_py.errors import MariusInputError
from marius_py.distributed.group import Group
from marius_py.distributed.relations import RelationExchange
from marius_py.distributed.scheduler_service import SchedulerClient, SchedulerServer
from marius_py.trainer import Trainer, tf32_matmuls
from storage.buffer import PartitionBuffer

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

    def begin_version(self, epoch: int, states_done: int = 0) -> Path:
        raise AssertionError("only rank 0 commits versions")


class DistributedTrainer(Trainer):
    def __init__(self, config, dataset, run_dir, group: Group, progress: bool = True):
        self.group = group
        self.holds_log = Path(run_dir) / DISTRIBUTED_DIR / f"rank{group.rank}.jsonl"
        super().__init__(config, dataset, run_dir, progress=progress and group.is_leader)
        scheduler_log = Path(run_dir) / DISTRIBUTED_DIR / "scheduler.jsonl"
        self._forget_epochs_after(self.state.epoch, [self.holds_log] + ([scheduler_log] if group.is_leader else []))
        self.server = SchedulerServer(group.store_connection(), config.storage.num_partitions, config.training.seed,
                                      scheduler_log, self._capacity()) if group.is_leader else None
        self.client = SchedulerClient(group.store_connection(), group.rank,
                                      alive=self.server.check if self.server else None)
        self.relations = RelationExchange(self.model.relation_parameters(), group.collectives, group.world_size,
                                         config.distributed.relation_sync_seconds)
        self.buckets_trained = 0

    # ---- the run directory: rank 0 creates and restores it, the others open what it made ----
    def _run_directory(self, run_dir) -> RunDirectory:
        return RunDirectory(run_dir) if self.group.is_leader else FollowerRunDirectory(run_dir)

    @staticmethod
    def _forget_epochs_after(epoch: int, logs: list[Path]) -> None:
        """Drop log lines of epochs after the checkpoint (a resume trains them again)."""
        for log in logs:
            if log.exists():
                kept = [line for line in log.read_text().splitlines() if json.loads(line)["epoch"] <= epoch]
                log.write_text("".join(line + "\n" for line in kept))

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
        """``distributed.partitions_per_trainer`` slots (no read-ahead: the next grant is known only when
        granted)."""
        if self.buffer is None:
            self.buffer = PartitionBuffer(self.store, self._capacity(), self.table_device, swap_size=1,
                                          lookahead=0, pin_memory=self._zero_copy_tables())
        return self.buffer

    def _state_commit_due(self) -> bool:
        return False  # the group commits at epoch ends only

    # ---- an epoch: granted buckets as spans ----
    def train_epoch(self, epoch: int) -> dict:
        self.relations.start_epoch()
        self.buckets_trained, rounds_before = 0, self.relations.rounds
        record = super().train_epoch(epoch)
        self.relations.finish_epoch()
        record["buckets"] = self.buckets_trained
        # all-reduce rounds of the relation parameters (each moves them once, plus the epoch's final one)
        record["relation_rounds"] = self.relations.rounds - rounds_before + 1
        return record

    def _spans(self, epoch: int, first_state: int = 0, ordering=None):
        buffer = self.partition_buffer()
        held_since: dict[int, float] = {}
        while True:
            if self.server is not None:
                self.server.check()
            self.relations.apply_pending()
            grant = self.client.acquire(epoch)
            if grant.write_back:
                self._release(epoch, buffer, grant.write_back, held_since)
            if grant.bucket is None:
                if grant.finished:
                    break
                continue
            for partition in grant.read:
                held_since[partition] = time.time()
            view = buffer.hold(sorted(held_since))  # the bucket's partitions and those kept: negatives from all
            self.buckets_trained += len(grant.buckets)
            yield self._buffer_span(view, self.dataset.edges.buckets(grant.buckets)), \
                buffer.embeddings, buffer.state
        if held_since:  # (the finishing grant wrote everything back)
            self._release(epoch, buffer, sorted(held_since), held_since)

    def _release(self, epoch: int, buffer: PartitionBuffer, partitions, held_since: dict) -> None:
        """Write ``partitions`` back, log how long this trainer held them, then tell the scheduler."""
        self._synchronize()
        buffer.release(partitions)
        released = time.time()
        with open(self.holds_log, "a", encoding="utf-8") as handle:
            for partition in partitions:
                handle.write(json.dumps({"epoch": epoch, "partition": int(partition),
                                         "from": held_since.pop(partition), "to": released}) + "\n")
        self.client.written(epoch, partitions)

    # ---- the group's epoch loop ----
    def _train(self):
        t = self.config.training
        if self.state.states_done:
            raise MariusInputError("the last checkpoint stopped inside an epoch (one process with "
                                   "training.checkpoint_interval); trainers of a group resume at epoch ends",
                                   path=self.run.path, expected="resume it with one process to the epoch's end")
        self.run.write_config(self.config)
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
                          "bytes_written": r["io"]["bytes_written"]} for rank, r in enumerate(records)],
            "pipeline": records[0]["pipeline"]}


def worker_pid_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / DISTRIBUTED_DIR / f"rank{rank}.pid"


def write_pid(run_dir: Path, rank: int) -> None:
    """Each trainer's process id, for operators (and the failure test) to find a trainer."""
    path = worker_pid_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")

