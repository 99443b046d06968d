"""A trainer of a torchrun group, as the trainer's span source: buckets from rank 0's scheduler, partitions
handed over between trainers.

As PyTorch-BigGraph's trainers: each holds the partitions of the bucket it was
granted (and keeps up to ``distributed.partitions_per_trainer`` of those it
held), trains the bucket's edges (with every other bucket left among the same
partitions, in one shuffled span) with negatives from them, and writes a
partition back to its own store before the scheduler lets another trainer have
it; that trainer then receives it over torch.distributed (``hand_over``), so no
update is lost and no file system is shared. While a span trains, a thread
asks for the next grant and fills spare slots with its partitions, so
hand-overs overlap training as a buffer's prefetch does. Every trainer's
relation updates reach the others (``relations.RelationExchange``).

Every epoch ends with every trainer's holdings gathered (each partition held
by exactly one trainer: ``TrainingState.holders``, committed with each
version), so each trainer's version keeps the partitions its store holds.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from marius_py.checkpoint import RunFingerprint
from marius_py.config import Config
from marius_py.distributed.group import LEADER, Group
from marius_py.distributed.hand_over import (Holdings, PartitionSender, PartitionTransfer, gather_to_leader,
                                             holders_of)
from marius_py.distributed.relations import RelationExchange
from marius_py.distributed.scheduler_service import SchedulerClient, SchedulerServer
from marius_py.distributed.write_backs import WriteBacks
from marius_py.errors import MariusInputError
from marius_py.orderings import Ordering
from marius_py.orderings.scheduler import Grant
from marius_py.plan import BUSY_PARTITIONS
from marius_py.run_log import read_json_lines
from marius_py.spans import Span, SpanInputs, buffer_span
from marius_py.storage.buffer import Fetch, PartitionBuffer

DISTRIBUTED_DIR = "distributed"  # in each trainer's run directory: its holds log (and the leader's, the scheduler's)
HOLDS_LOG = "holds.jsonl"
SCHEDULER_LOG = "scheduler.jsonl"
WAITS = ("bucket", "read", "write_back", "send", "others")  # what a trainer waits for, apart from training


def check_group_config(config: Config, where: Path) -> None:
    """What torchrun trainers refuse, before anything is written (``where``: the config's run directory)."""
    if config.storage.dtype == "bfloat16":
        raise MariusInputError(f"storage.dtype={config.storage.dtype}: torchrun trainers exchange float32 "
                               "partitions", path=where / "config.yaml",
                               expected="storage.dtype=float32 under torchrun")
    if config.storage.num_partitions == 1:
        raise MariusInputError(f"storage.num_partitions={config.storage.num_partitions}: torchrun trainers "
                               "share the tables by partition", path=where / "config.yaml",
                               expected="storage.num_partitions of at least 2 under torchrun (4 per trainer "
                                        "or more keeps them busy), or 0 for the plan's choice")


def too_few_partitions(num_partitions: int, num_trainers: int) -> str | None:
    """A warning when the trainers would hold more than half the partitions (they then wait for grants)."""
    if num_trainers == 1 or num_partitions >= BUSY_PARTITIONS * num_trainers:
        return None
    return (f"storage.num_partitions={num_partitions} for {num_trainers} trainers: trainers wait for one "
            f"another's partitions; {BUSY_PARTITIONS * num_trainers} or more keep them busy")


def refuse_other_datasets(fingerprints: list[RunFingerprint], directory: Path) -> None:
    """Every trainer opened the same graph and model (``fingerprints``, by rank: each machine prepares its own
    copy of the dataset), compared by the model's shapes and the dataset's content."""
    leader = fingerprints[LEADER]
    differing = {rank: leader.changes_to(fingerprint, "on rank 0", f"on rank {rank}")
                 for rank, fingerprint in enumerate(fingerprints) if fingerprint != leader}
    if differing:
        rank, differences = next(iter(differing.items()))
        raise MariusInputError(f"trainers {sorted(differing)} opened another dataset or model than rank 0 (rank "
                               f"{rank}: {'; '.join(differences)})", path=directory,
                               expected="the same dataset (preprocessed alike, from the same files) and config on "
                                        "every machine")


class GrantedSpans:
    """The span source of a trainer of a group (``marius_py.spans``)."""

    commits_between_states = False  # the group commits at epoch ends only

    def __init__(self, inputs: SpanInputs, group: Group, held: int, relation_sync_seconds: float,
                 dataset_directory: Path):
        """``held``: the partitions a trainer holds at once (``Plan.held_per_trainer``); ``relation_sync_seconds``:
        how often the relations are exchanged (``distributed.relation_sync_seconds``); ``dataset_directory``:
        the dataset as the user gave it (errors name it, not a copy bucketed for the run)."""
        self.inputs, self.group = inputs, group
        refuse_other_datasets(group.all_gather(inputs.fingerprint), dataset_directory)
        self.num_partitions = inputs.layout.num_partitions
        self.capacity = held
        self.buffer: PartitionBuffer | None = None
        self._state_holders: list[int] | None = None  # (``resumed``; then as each epoch's end gathers them)
        self._committed_epoch = 0
        self.logs = inputs.run_path / DISTRIBUTED_DIR
        self.logs.mkdir(parents=True, exist_ok=True)
        self.holdings = Holdings()
        self.server = SchedulerServer(group.store_connection(), self.num_partitions, inputs.seed,
                                      self.logs / SCHEDULER_LOG, self.capacity, group.world_size) \
            if group.is_leader else None
        alive = self.server.check if self.server else None
        self.client = SchedulerClient(group.store_connection(), group.rank, alive=alive)
        self.ahead_client = SchedulerClient(group.store_connection(), group.rank, alive=alive, channel="ahead")
        self._asking_ahead = ThreadPoolExecutor(1, thread_name_prefix="grant-ahead")
        self.transfer = PartitionTransfer(group, lambda: inputs.tables.store, lambda: inputs.table_device)
        self.sender = PartitionSender(SchedulerClient(group.store_connection(), group.rank, alive=alive,
                                                      channel="send"), self.transfer, self.holdings)
        self.write_backs = WriteBacks(SchedulerClient(group.store_connection(), group.rank, alive=alive,
                                                      channel="write-back"), self.logs / HOLDS_LOG, self.holdings)
        self.relations = RelationExchange(inputs.relation_parameters, group.control, group.world_size,
                                         relation_sync_seconds)
        self.waits = dict.fromkeys(WAITS, 0.0)  # seconds this epoch, by what the trainer waited for
        self.buckets_trained = 0
        self._sent_before = self.transfer.counters.snapshot()
        self._logs_trimmed = False

    # ---- what the trainer asks of a span source ----
    def partition_buffer(self) -> PartitionBuffer:
        """``capacity`` slots, and as many spare: the next grant is filled while the last one's are written back
        (``plan.trainer_buffer_bytes``; ``lookahead=1`` only sizes the spares; the trainer fills the
        next grant's partitions itself)."""
        if self.buffer is None:
            self.buffer = self.inputs.partition_buffer(self.capacity, swap_size=self.capacity, lookahead=1)
        return self.buffer

    def close_buffer(self) -> None:
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None

    def initial_partitions(self) -> list[int]:
        """A new run's partitions start spread round-robin, each initialised by the trainer that holds it."""
        return [p for p, rank in enumerate(self._round_robin()) if rank == self.group.rank]

    def write_back(self) -> None:
        pass  # (every partition is written back on release, before the epoch's barrier)

    def held_partitions(self) -> list[int]:
        return self.holdings.snapshot()

    def _round_robin(self) -> list[int]:
        return [p % self.group.world_size for p in range(self.num_partitions)]

    def _holders(self) -> list[int]:
        return self._state_holders or self._round_robin()

    def resumed(self, epoch: int, holders: list[int] | None) -> None:
        self._committed_epoch, self._state_holders = epoch, holders

    def holders(self) -> list[int] | None:
        return self._holders()  # (before the first epoch ends: round robin, as a new run starts them)

    # ---- an epoch ----
    def spans(self, epoch: int, first_state: int = 0, ordering: Ordering | None = None) -> Iterator[Span]:
        if first_state:
            raise MariusInputError("the last checkpoint stopped inside an epoch (one process with "
                                   "training.checkpoint_interval); trainers of a group resume at epoch ends",
                                   path=self.inputs.run_path, expected="resume it with one process to the "
                                                                        "epoch's end")
        self._begin_epoch(epoch)
        buffer = self.partition_buffer()
        held_since: dict[int, float] = {}
        ahead: Future | None = None  # the next grant, asked (and its partitions filled) while a span trains
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
                view = buffer.hold(sorted(held_since), self._fetches(grant))
            self.buckets_trained += len(grant.buckets)
            span = buffer_span(view, self.inputs.dataset.edges.read_buckets(grant.buckets), self.inputs.plan_device)
            ahead = self._asking_ahead.submit(self._ask_ahead, epoch, buffer, held_since)
            yield span, buffer.embeddings, buffer.state
        if held_since:  # (the finishing grant wrote everything back)
            self._release(epoch, buffer, sorted(held_since), held_since)
        self._end_epoch()

    def _begin_epoch(self, epoch: int) -> None:
        """Holdings as the last commit (or a new run) left them; the leader starts the epoch's scheduler from
        them before any trainer asks."""
        if not self._logs_trimmed:
            self._forget_epochs_after(self._committed_epoch)
        holders = self._holders()
        self.holdings.reset(p for p, rank in enumerate(holders) if rank == self.group.rank)
        if self.server is not None:
            self.server.begin_epoch(epoch, dict(enumerate(holders)))
        self.group.barrier()
        self.waits = dict.fromkeys(WAITS, 0.0)
        self.buckets_trained = 0
        self._sent_before = self.transfer.counters.snapshot()
        self._rounds_before = self.relations.rounds
        self.relations.start_epoch()
        self.sender.start_epoch(epoch)

    def _end_epoch(self) -> None:
        """Every write-back and send done, relations exchanged exactly, and every trainer's holdings gathered:
        each partition is in exactly one trainer's store."""
        with self._waiting("write_back"):
            self.write_backs.wait()
        with self._waiting("send"):
            self.sender.finish()
        with self._waiting("others"):  # (both wait for the slowest trainer)
            self.relations.finish_epoch()
            holdings = self.group.all_gather(self.holdings.snapshot())
        self._state_holders = holders_of(holdings, self.num_partitions)

    def _fetches(self, grant: Grant) -> dict[int, Fetch]:
        """The grant's partitions that another trainer hands over."""
        return {partition: self.transfer.fetch_from(source) for partition, source in zip(grant.read, grant.sources)
                if source != self.group.rank}

    def _ask_ahead(self, epoch: int, buffer: PartitionBuffer, held_since: dict) -> Grant | None:
        """On the ahead thread while a span trains: the next grant, its new partitions prefetched (the
        training thread touches neither the buffer's books nor ``held_since`` until this returns). None:
        no bucket is free now; the training thread asks again once its span is done."""
        grant = self.ahead_client.acquire(epoch, ahead=True)
        if grant.bucket is None and not grant.finished:
            return None
        for partition in grant.read:
            held_since[partition] = time.time()
        buffer.prefetch(grant.read, self._fetches(grant))
        return grant

    def _between_buckets(self) -> None:
        """Nothing trains now: take the relations' last correction (a peer's exchange round waits for it)
        and raise a failed write-back or send."""
        self.relations.apply_pending()
        self.write_backs.check()
        self.sender.check()

    @contextmanager
    def _waiting(self, what: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.waits[what] += time.perf_counter() - started

    def _release(self, epoch: int, buffer: PartitionBuffer, partitions, held_since: dict) -> None:
        """Write ``partitions`` back behind training; the scheduler hears of them once they are written."""
        self.inputs.synchronize()  # (the GPU's last updates of their rows are done before they are copied out)
        writes = buffer.release(partitions)
        self.write_backs.submit(epoch, {p: held_since.pop(p) for p in partitions}, writes)

    def _forget_epochs_after(self, epoch: int) -> None:
        """Drop log lines of epochs after the checkpoint (a resume trains them again), and a last line a kill
        cut short; a damaged line elsewhere is refused with the file and line."""
        for log in (self.logs / HOLDS_LOG, self.logs / SCHEDULER_LOG):
            if log.exists():
                kept = [record for _, record in read_json_lines(log) if record.get("epoch", 0) <= epoch]
                log.write_text("".join(json.dumps(record) + "\n" for record in kept))
        self._logs_trimmed = True

    # ---- records ----
    def epoch_record(self) -> dict:
        """This trainer's share: buckets, what it waited for, partitions handed over, where each partition is
        at the epoch's end, relation rounds (each moves the relations once, plus the epoch's final one)."""
        sent = self.transfer.counters.snapshot()
        idle = sum(self.waits.values())
        return {"buckets": self.buckets_trained, "partitions_per_trainer": self.capacity,
                "waits": {f"{what}_seconds": seconds for what, seconds in self.waits.items()},
                "idle_seconds": idle, "sent": {key: sent[key] - self._sent_before[key] for key in sent},
                "holders": self._state_holders,
                "relation_rounds": self.relations.rounds - self._rounds_before + 1}

    def combine(self, records: list[dict]) -> dict:
        """One epoch record for the group: summed loss and IO, the slowest trainer's time, and per trainer its
        buckets, edges/s, partition bytes read, written and handed over, and idle time."""
        seconds = max(r["seconds"] for r in records)
        edges = sum(r["edges_per_s"] * r["seconds"] for r in records)
        io = {key: sum(r["io"][key] for r in records) for key in records[0]["io"]}
        return {"event": "epoch", "epoch": records[0]["epoch"], "loss": sum(r["loss"] for r in records),
                "seconds": seconds, "edges_per_s": edges / seconds, "io": io,
                "handed_over_bytes": sum(r["sent"]["bytes_sent"] for r in records), "holders": records[0]["holders"],
                "relation_rounds": records[0]["relation_rounds"],
                "partitions_per_trainer": records[0]["partitions_per_trainer"],
                "trainers": [{"rank": rank, "buckets": r["buckets"], "seconds": r["seconds"],
                              "edges_per_s": r["edges_per_s"], "bytes_read": r["io"]["bytes_read"],
                              "bytes_written": r["io"]["bytes_written"], "bytes_received": r["io"]["bytes_received"],
                              "bytes_sent": r["sent"]["bytes_sent"], "idle_seconds": r["idle_seconds"],
                              "waits": r["waits"]}
                             for rank, r in enumerate(records)],
                "pipeline": records[0]["pipeline"]}

    # ---- evaluation, and the end ----
    def gather_for_evaluation(self) -> dict:
        """Every partition held elsewhere sent to the leader's store (it then holds them all)."""
        started = time.perf_counter()
        holders = self._holders()
        moved = gather_to_leader(self.group, self.transfer, holders)
        self.holdings.reset(range(self.num_partitions) if self.group.is_leader else ())
        self._state_holders = [LEADER] * self.num_partitions
        return {"partitions": sum(1 for rank in holders if rank != LEADER), "bytes": moved,
                "seconds": time.perf_counter() - started}

    def close(self) -> None:
        """Stop the threads and release the buffer (after training, or when it failed)."""
        self._asking_ahead.shutdown(wait=True)
        self.sender.stop()
        self.write_backs.close()
        if self.server is not None:
            self.server.stop()
        self.close_buffer()
