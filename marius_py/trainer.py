"""The trainer: epochs of a run, in memory or out of core through a partition buffer, with checkpoints.

What a batch computes is the step's (``marius_py/step/``); how batches move
is the pipeline's (``pipeline/``). The trainer walks the epochs, hands each
span of edges to the runner, evaluates, logs and commits checkpoints, and
tells the callbacks (``marius_py.callbacks``, the metrics log first). It is
built from two parts: a *span source* (``marius_py/spans.py``: the tables in
memory, the buffer's walk over an ordering, or a torchrun group's granted
buckets) and the *group* of trainers it belongs to (``marius_py/group.py``:
this process alone, or torchrun's), which decides who validates, logs and
holds the commit marker. Its ``Checkpointer`` (``marius_py/checkpointer.py``)
owns the commits: which version a run continues from, when one is due, what
it holds, and positions inside an epoch.

Randomness: every draw of epoch ``e`` comes from generators seeded with
``(seed, e)``, so resuming at an epoch boundary replays training exactly when
training is synchronous (staleness bound 1, one load thread; the CPU default).
With more batches in flight, what a batch reads depends on thread timing.
Versions committed between buffer states (out of core, with
``training.checkpoint_interval``) also keep the generators' states, so a
resume continues the epoch at the next state with the same draws.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from marius_py.callbacks import CallbackList, RunView, as_callbacks, configured_callbacks
from marius_py.checkpoint import MetricsLog, RunDirectory, RunFingerprint, TrainingState
from marius_py.checkpointer import Checkpointer, Finished, Snapshot, Walk, host_copy
from marius_py.config import Config, dedup_setting
from marius_py.layout import continue_chain, ending, epoch_ordering
from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError
from marius_py.group import ONE_PROCESS, TrainerGroup
from marius_py.spans import BufferWalk, LiveTables, SpanInputs, SpanSource, SpanSourceFactory, WholeTables
from marius_py.timeline import EpochPhases, StateTimeline, Startup
from marius_py.evaluation import InMemoryNodes, NodeTable, StoredNodes, build_known_answers, evaluate_split
from marius_py.process_settings import set_deterministic_algorithms
from marius_py.random_streams import epoch_generators, flat
from marius_py.step.model import StepModel
from marius_py.step.runners import build_multi_device_runner, build_span_runner
from marius_py.orderings import Ordering, balanced_buckets
from marius_py.prepared_run import PreparedRun, prepare_run
from marius_py.pipeline.placements import PLACEMENT_DEVICE, PLACEMENT_REPLICATED, PLACEMENT_SPLIT, choose_plan_device
from marius_py.pipeline.runner import Runner
from marius_py.storage.buffer import PartitionBuffer
from marius_py.storage.chunk_files import page_aligned_empty
from marius_py.storage.embedding_store import EmbeddingStore, initial_tables


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """TF32 float32 matmuls inside the block (training), full float32 outside (evaluation)."""
    previous = torch.get_float32_matmul_precision()
    if enabled:
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


_INIT_BLOCK = 1 << 16
INIT_THREADS = 8  # partitions initialised at once when a store is created (memory: 2 pieces of rows each)


def init_rows(seed: int, init_scale: float, dim: int):
    """Initial embeddings of rows [start, end): normal(0, init_scale).

    Drawn in fixed blocks of 65,536 rows, each seeded by its index, so a node's
    initial vector does not depend on how the nodes are partitioned.
    """
    last = threading.local()  # each thread's last block: pieces that straddle blocks draw each once

    def block_rows(block: int) -> torch.Tensor:
        if getattr(last, "block", None) != block:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + block)
            last.block, last.rows = block, torch.randn(_INIT_BLOCK, dim, generator=generator) * init_scale
        return last.rows

    def init(start: int, end: int) -> np.ndarray:
        parts = []
        for block in range(start // _INIT_BLOCK, (end - 1) // _INIT_BLOCK + 1):
            first = block * _INIT_BLOCK
            parts.append(block_rows(block)[max(start, first) - first:min(end, first + _INIT_BLOCK) - first])
        return torch.cat(parts).numpy()
    return init


class Trainer:
    """Trains one run directory; ``train()`` runs the remaining epochs.

    The run's live ``EmbeddingStore`` (``RUN_DIR/store``) is the training state
    on disk. With ``storage.num_partitions == 1`` the tables live in memory (loaded
    whole, or initialised there by a new run, whose first commit writes them);
    otherwise a ``PartitionBuffer`` walks the epoch's ordering.
    A checkpoint flushes the tables to the live store and snapshots it with hard
    links: a chunk file a snapshot links is replaced by rename, never rewritten; one
    only the live store holds is overwritten in place (a resume rebuilds the live
    store from a committed version).
    """

    def __init__(self, prepared: PreparedRun, run_dir: str | Path, progress: bool = True,
                 startup: Startup | None = None, group: TrainerGroup = ONE_PROCESS,
                 spans: SpanSourceFactory | None = None, callbacks: Sequence = ()):
        """``prepared``: the planned run (``prepare_run``; ``Trainer.of`` plans it); ``group``: the trainers of
        the run (this process alone by default); ``spans``: builds the span source from its inputs (by default
        the tables in memory, or the buffer's walk when the store is partitioned); ``callbacks``
        (``marius_py.callbacks``) run after those the config names. The trainer writes no config.yaml: the
        run's setup does (``api.train``), so a directory trained by ``Trainer.of`` alone is no run that
        ``--resume`` or ``load_checkpoint`` open."""
        self.group = group
        self.startup = startup  # logged at the first batch this process trains
        self.plan, self.config, self.dataset = prepared.plan, prepared.config, prepared.dataset
        self.devices, self.graph = prepared.devices, prepared.graph
        self.run = RunDirectory(run_dir)  # (a trainer of a group: its own; the leader's is the run's)
        self.callbacks = CallbackList(self._callbacks(prepared.config, callbacks), self._view)
        self.progress = progress and group.is_leader
        config, dataset = self.config, self.dataset
        self.layout = self.plan.layout  # (the physical store, resolved once)
        self.device = self.devices[0]  # the model of record (checkpoints, evaluation) lives here
        self.partitioned = self.layout.num_partitions > 1
        if config.training.num_threads:
            torch.set_num_threads(config.training.num_threads)
        torch.manual_seed(config.training.seed)  # relation initialisation
        self.model = StepModel(config, dataset.num_nodes, dataset.num_relations, self.device)
        # One relation replica per further device; restore() keeps them equal to the model.
        self.replicas = [self.model] + [StepModel(config, dataset.num_nodes, dataset.num_relations, device)
                                        for device in self.devices[1:]]
        self._startup_mark("model")
        self.fingerprint = RunFingerprint.of(config, dataset.metadata, self.layout)
        self.state = self.fingerprint.stamp(TrainingState())
        t, s = config.training, config.storage
        self.checkpointer = Checkpointer(self.run, group, self.fingerprint, self.layout.dtype, t.checkpoint_interval,
                                        Walk(t.seed, self.layout.ordering, self.layout.num_partitions,
                                             self.layout.buffer_capacity, self.layout.group_size, s.edge_assignment,
                                             s.continue_epochs))
        self.tables = LiveTables()
        # Commits written on a thread (the plan's choice; a group's commits are collective, so synchronous).
        self.commits_behind = self.plan.commits_behind and group.world_size == 1
        self._snapshot_tables: Future | None = None  # host tables for snapshots, reused from commit to commit
        self.spans: SpanSource | None = None  # (built once the runner says where tables live)
        self._build_runner()
        self._startup_mark("runner")
        try:
            self.spans = (spans or (BufferWalk if self.partitioned else WholeTables))(self._span_inputs())
            self._open_run()
            self._check_position()
            if self.commits_behind and not self.partitioned:  # (allocated while the first epoch trains)
                self._snapshot_tables = self.checkpointer.on_writer(self._snapshot_memory)
        except BaseException:
            self.close()  # (a runner's worker processes, a buffer: nobody else will release them)
            raise
        self._startup_mark("tables")
        # Records of epochs whose checkpoint never committed are replayed, not duplicated.
        self.run.truncate_metrics(self.state.epoch)
        self._known = None

    @classmethod
    def of(cls, config: Config, dataset: Dataset, run_dir: str | Path, progress: bool = True, **kw) -> Trainer:
        """The trainer of ``config``'s run on ``dataset``, planned here (``prepare_run``)."""
        return cls(prepare_run(config, dataset, run_dir, progress), run_dir, progress=progress, **kw)

    def _span_inputs(self) -> SpanInputs:
        c = self.config
        return SpanInputs(self.dataset, self.tables, self.layout, c.storage, c.training.seed,
                          self.plan_device, self.table_device, self.runner.zero_copy, self.run.path,
                          self.fingerprint, self.model.relation_parameters(), self.synchronize,
                          self._next_first_state)

    def _next_first_state(self, epoch: int) -> tuple[int, ...] | None:
        """The storage partitions epoch ``epoch + 1`` starts with, which the buffer reads ahead while this
        epoch's last states train (None: training ends with this epoch, or the next starts where it ends)."""
        if epoch >= self.config.training.epochs or self.config.storage.continue_epochs:
            return None
        return self.ordering(epoch + 1).resident(0)

    def _callbacks(self, config: Config, given: Sequence) -> list:
        """The metrics log first; then, the leader's alone, the callbacks the config names and those ``given``."""
        if not self.group.is_leader:
            return [MetricsLog(self.run)]
        t = config.training
        return [MetricsLog(self.run), *configured_callbacks(t.callbacks, t.tensorboard),
                *as_callbacks(given, "callbacks")]

    def _view(self, stop_reason: str | None) -> RunView:
        """What a callback's hook sees of the run now."""
        s = self.state
        counted = s.best_epoch > 0
        return RunView(self.run.path, s.epoch, self.config.training.epochs, s.best_epoch if counted else None,
                       s.best_mrr if counted else None, stop_reason)

    def log(self, record: dict) -> None:
        """A metrics record, to the metrics log and every callback."""
        self.callbacks.record(record)

    def _open_run(self) -> None:
        """The run's state: restored from the version it continues from, or a new run's."""
        version = self.checkpointer.version_to_continue()
        if version is not None:
            self.restore(version)
        else:
            self._start_new_run()

    def _startup_mark(self, phase: str) -> None:
        if self.startup is not None:
            self.startup.mark(phase)

    @property
    def multi_device(self) -> bool:
        return len(self.devices) > 1

    def _build_runner(self) -> None:
        """The placement, where the node tables (or the buffer's slots) live, and the pipeline runner."""
        config = self.config
        if self.multi_device:
            p = config.pipeline
            if p.placement == PLACEMENT_SPLIT and (self.partitioned or dedup_setting(p.dedup) is False):
                raise MariusInputError("pipeline.placement: split shares in-memory tables out across the GPUs, "
                                       "which needs pipeline.dedup and storage.num_partitions=1",
                                       expected="pipeline.placement=host or auto")
            if p.placement == PLACEMENT_REPLICATED and self.partitioned:
                raise MariusInputError("pipeline.placement: replicated keeps all the tables on every GPU, "
                                       "which needs storage.num_partitions=1",
                                       expected="pipeline.placement=host or auto")
            self.placement = self.plan.placement
            # Replicas start from device 0's tables; split and host tables live in (pinned) host memory.
            self.table_device = self.device if self.placement == PLACEMENT_REPLICATED else torch.device("cpu")
            self.runner: Runner = build_multi_device_runner(self.replicas, self.placement, config, self.devices,
                                                            self._row_bytes())
            self.plan_device = choose_plan_device(True, self.device, self.table_device, self._edge_bytes())
            return
        self.placement = self.plan.placement
        self.table_device = self.device if self.placement == PLACEMENT_DEVICE else torch.device("cpu")
        self.runner = build_span_runner(self.model, self.placement, config, self.device)
        self.plan_device = choose_plan_device(self.runner.zero_copy, self.device, self.table_device,
                                              self._edge_bytes())

    def _edge_bytes(self) -> int:
        return self.dataset.metadata.num_train * 3 * torch.long.itemsize

    # ---- the live store and checkpoints ----
    def _create_store(self) -> None:
        """The live store: initial embeddings written partition by partition, zero optimizer state. Tables held
        in memory are initialised there (``_open_live``); their store is written by the first commit."""
        c, path = self.config, self.checkpointer.live_store_path
        shutil.rmtree(path, ignore_errors=True)
        EmbeddingStore.create(path, self.dataset.num_nodes, c.model.dim, self.state_dim(),
                              self.layout.num_partitions, init=self._init_rows() if self.partitioned else None,
                              threads=self._init_threads(), dtype=self.table_dtype,
                              partitions=self.spans.initial_partitions())

    def state_dim(self) -> int:
        return self.model.node_optimizer.state_dim(self.config.model.dim)

    def _init_rows(self):
        c = self.config
        return init_rows(c.training.seed, c.model.init_scale, c.model.dim)

    @staticmethod
    def _init_threads() -> int:
        return min(INIT_THREADS, os.cpu_count() or 1)

    def _start_new_run(self) -> None:
        """A new run (or one killed before its first commit): the seeded initial state, recreated identically
        by a resume, so it is not committed as a version: the first epoch's rewrites then need no second
        copy of the store on disk."""
        self.state = self.checkpointer.start_new()
        self.spans.resumed(0, None)
        self._create_store()
        self._open_live(self.model.state_dict(), new=True)

    def restore(self, version: Path) -> None:
        """Make ``version`` the live state: store files, model parameters, position."""
        self._wait_for_commit()  # (a commit in flight writes the live store)
        self._snapshot_tables = None  # (its memory is given back before the tables are read again)
        model_state, self.state = self.checkpointer.restore(version, self.dataset.directory)
        if self.partitioned and self.config.storage.continue_epochs and self.state.ended_with is not None:
            continue_chain(self.layout, self.config.training.seed, self.state.epoch, self.state.ended_with)
        self.spans.resumed(self.state.epoch, self.state.holders)
        self._open_live(model_state)

    def _open_live(self, model_state: dict, new: bool = False) -> None:
        """Load ``model_state`` into the model and its replicas, and open the live store (in memory: load it,
        or with ``new`` initialise the tables)."""
        for replica in self.replicas:  # each its own copy: same-device tensors would alias the optimizer state
            replica.load_state_dict(model_state if replica is self.model else copy.deepcopy(model_state))
        self.spans.close_buffer()  # a buffer over the old files must not write them back
        store = self.tables.store = EmbeddingStore(self.checkpointer.live_store_path)
        if not self.partitioned:
            # Host tables are pinned only for the fused step, whose GPU kernels read and write them in place;
            # otherwise they stay pageable and each batch's rows are gathered into pinned staging memory.
            pinned = self.zero_copy_tables()
            if new:
                where = torch.device("cpu") if pinned else self.table_device
                tables = initial_tables(store.num_nodes, store.dim, store.state_dim, self._init_rows(),
                                        self._init_threads(), pinned, self.table_dtype, where)
            else:
                tables = store.read_tables(pin_memory=pinned)
            self.tables.nodes, self.tables.node_state = (table if pinned else table.to(self.table_device)
                                                         for table in tables)

    def zero_copy_tables(self) -> bool:
        """Whether the runner's GPU kernels train host tables in place (they are then pinned)."""
        return self.runner.zero_copy

    def _row_bytes(self) -> int:
        """Bytes of one node's embedding and optimizer state."""
        return (self.config.model.dim + self.state_dim()) * self.table_dtype.itemsize

    @property
    def table_dtype(self) -> torch.dtype:
        """How node embeddings and optimizer state are stored (``storage.dtype``); training computes in float32."""
        return getattr(torch, self.layout.dtype)

    @property
    def buffer(self) -> PartitionBuffer | None:
        return self.spans.buffer

    def partition_buffer(self) -> PartitionBuffer:
        """The partition buffer, allocated on first use (evaluation and export never need it)."""
        return self.spans.partition_buffer()

    def _commit(self, is_best: bool, position: dict | None = None) -> None:
        """Commit a version of the (flushed) live store and the model (``position``: where inside an epoch)."""
        self._wait_for_commit()  # (one in flight is reported first)
        self.state.holders = self.spans.holders()
        version = self.checkpointer.commit(self.model.state_dict(), self.state, is_best,
                                          self.spans.held_partitions(), position)
        self.callbacks.checkpoint(version, self.state.epoch)

    def save_checkpoint(self, is_best: bool = False, behind: bool = False) -> None:
        """Commit the state now; ``behind``: write it on the checkpointer's thread while training goes on."""
        if self.partitioned:
            self.synchronize()  # (the GPU's last updates of the resident partitions are done)
            self.spans.write_back()  # (the buffer's resident partitions, kept for the next epoch)
        if behind and (self.partitioned or self._snapshot_memory_allocated()):
            self.checkpointer.commit_behind(lambda: self._snapshot(is_best), self.tables.store)
            return
        if not self.partitioned:
            self.checkpointer.wait()  # (a commit in flight writes the live store)
            self.tables.store.write_all(self.tables.nodes, self.tables.node_state)  # (streamed from where they live)
        self._commit(is_best)

    def _snapshot(self, is_best: bool) -> Snapshot:
        """What the version committed behind training holds, copied now (tables in memory included)."""
        self.state.holders = self.spans.holders()
        tables = None if self.partitioned else self._copy_tables()
        return Snapshot(host_copy(self.model.state_dict()), copy.deepcopy(self.state), is_best,
                        self.spans.held_partitions(), tables)

    def _snapshot_memory(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Host memory for snapshots of the in-memory tables (pinned for a GPU's: its copy runs at full speed;
        allocating gigabytes of it takes seconds, so the checkpointer's thread does it while training starts)."""
        pin = self.table_device.type == "cuda"
        return tuple(page_aligned_empty(*table.shape, pin_memory=pin, dtype=table.dtype)
                     for table in (self.tables.nodes, self.tables.node_state))

    def _snapshot_memory_allocated(self) -> bool:
        """Whether the host memory for snapshots of the in-memory tables is there. Where it could not be
        allocated (pinned memory can run short of what the plan saw available), this commit and the run's
        later ones are synchronous, and the log says why."""
        if self._snapshot_tables is None:  # (commits behind training that the trainer did not plan on)
            self._snapshot_tables = self.checkpointer.on_writer(self._snapshot_memory)
        failure = self._snapshot_tables.exception()
        if failure is None:
            return True
        if not isinstance(failure, (RuntimeError, MemoryError, OSError)):  # (a bug, not memory running short)
            raise failure
        self.commits_behind = False
        reason = f"host memory for a snapshot of the tables could not be allocated ({failure})"
        self._say(f"commits are synchronous from epoch {self.state.epoch} on: {reason}")
        if self.group.is_leader:
            self.log({"event": "commits_synchronous", "epoch": self.state.epoch, "reason": reason})
        return False

    def _copy_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The in-memory tables copied into the host memory kept for snapshots (``_snapshot_memory_allocated``)."""
        copies = self._snapshot_tables.result()
        for copied, table in zip(copies, (self.tables.nodes, self.tables.node_state)):
            copied.copy_(table)
        return copies

    def _wait_for_commit(self) -> None:
        """Wait for the commit written behind training, if one is in flight, and report it."""
        self.checkpointer.wait()
        self._report_commits()

    def _report_commits(self) -> None:
        """Log the commits the checkpointer's thread completed, and tell the callbacks."""
        for done in self.checkpointer.finished():
            self._log_commit(done)
            self.callbacks.checkpoint(done.version, done.epoch)

    def _log_commit(self, done: Finished) -> None:
        if self.group.is_leader:
            self.log({"event": "commit", "epoch": done.epoch, "version": done.version.name,
                      "seconds": done.seconds, "folded": done.folded})

    def node_table(self) -> NodeTable:
        """The current embeddings for evaluation: in memory, or streamed from the live store (made current)."""
        if not self.partitioned:
            return InMemoryNodes(self.tables.nodes, self.device)
        self.synchronize()  # (the GPU's last updates of the resident partitions are done)
        self.spans.write_back()
        return StoredNodes(self.tables.store, self.device)

    # ---- training ----
    def ordering(self, epoch: int) -> Ordering:
        ordering = epoch_ordering(self.layout, self.config.training.seed, epoch, self.config.storage.continue_epochs)
        if self.config.storage.edge_assignment == "balanced":
            p = self.layout.num_partitions
            ordering = balanced_buckets(ordering, np.diff(self.dataset.edges.bucket_offsets()).reshape(p, p))
        return ordering

    def train_epoch(self, epoch: int) -> dict:
        t = self.config.training
        shuffling, sampling, dropout = self._epoch_generators(epoch)
        generators = flat([shuffling, sampling, dropout])
        first_state = self.state.states_done  # > 0: resuming inside this epoch
        ordering = self.ordering(epoch) if self.partitioned else None  # built once: spans and commits use it
        num_states = ordering.num_states if ordering else 1
        if first_state:
            self.checkpointer.restore_position(epoch, num_states, generators)
        num_edges = self.dataset.metadata.num_train
        total_loss = torch.full((), self.state.partial_loss_sum, device=self.device)
        self.runner.max_in_flight = 0  # per epoch
        if self.multi_device:
            self.runner.counters.reset()
        enqueued_before = self.runner.host_seconds  # (None where the runner does not time its host)
        io_before = self.partition_buffer().counters.snapshot() if self.partitioned else {}
        started = time.perf_counter()
        bar = tqdm(total=-(-num_edges // t.batch_size), desc=f"epoch {epoch}/{t.epochs}", unit="batch",
                   disable=None if self.progress else True, leave=False, dynamic_ncols=True)
        timeline = StateTimeline(self.buffer.counters, self.synchronize) if self.partitioned else None
        phases = EpochPhases()
        on_batch = self._first_batch_logger(bar.update)
        trained_edges = 0
        for states_done, (span, nodes, node_state) in enumerate(self.spans.spans(epoch, first_state, ordering),
                                                                 first_state + 1):
            phases.add("wait")
            self._report_commits()  # (a commit behind training that failed stops training here)
            if timeline:
                timeline.ready()
            edges, span.edges = span.edges.to(shuffling.device), None  # only the shuffled copy stays
            edges = edges[torch.randperm(len(edges), generator=shuffling, device=shuffling.device)]
            phases.add("prepare")
            self.runner.run(edges, nodes, node_state, span.candidates, sampling, dropout,
                            total_loss, on_batch)
            trained_edges += len(edges)
            if timeline:
                timeline.trained(len(edges))  # (synchronises the devices: the state's GPU work counts as train)
            phases.add("train")
            if states_done < num_states and self._state_commit_due():  # (after the last: the epoch commits)
                self._commit_between_states(epoch, num_states, states_done, total_loss, generators)
                phases.add("commit")
        bar.close()
        self.synchronize()  # CUDA graphs and streams return before the GPU is done: time the GPU work
        phases.add("sync")
        self.state.states_done, self.state.partial_loss_sum = 0, 0.0
        if ordering is not None:  # (a resume continues the chain from it, not from epoch 1)
            self.state.ended_with = list(ending(ordering))
        seconds = time.perf_counter() - started
        if not torch.isfinite(total_loss):
            raise MariusInputError(f"training diverged: the loss of epoch {epoch} is not finite",
                                   path=self.run.path / "config.yaml",
                                   expected="a smaller training.lr or model.init_scale")
        record = {"event": "epoch", "epoch": epoch, "loss": float(total_loss) / num_edges,
                  "seconds": seconds, "edges_per_s": trained_edges / seconds,
                  "pipeline": {"placement": self.placement, "staleness_bound": self.runner.effective_staleness,
                               "max_in_flight": self.runner.max_in_flight}, "time": phases.seconds}
        if self.multi_device:
            record["devices"] = self._devices_record(enqueued_before)
        if self.buffer is not None:
            after = self.buffer.counters.snapshot()
            record["io"] = {key: after[key] - io_before[key] for key in after}
            record["states"] = timeline.rows
        if first_state:  # seconds, edges/s, io and states cover the states this process trained
            record["resumed_at_state"] = first_state
        record.update(self.spans.epoch_record())
        return record

    def _devices_record(self, enqueued_before: float | None) -> dict:
        """Several devices' part of an epoch record: the transfers, dedup (with auto's timings in the epoch
        that chose), and the host's seconds spent enqueuing the steps where the runner times them."""
        runner = self.runner
        record = {"names": [str(d) for d in self.devices], "dedup": runner.dedup,
                  **runner.counters.snapshot(self.config.model.dim * 4, self._row_bytes())}
        trial = runner.dedup_trial
        if trial is not None and not getattr(self, "_dedup_trial_logged", False):
            record["dedup_trial"], self._dedup_trial_logged = trial, True
        if enqueued_before is not None:
            record["host_enqueue_seconds"] = runner.host_seconds - enqueued_before
        return record

    def _first_batch_logger(self, on_batch: Callable[[int], None]) -> Callable[[int], None]:
        """``on_batch``, which also logs the start-up record at the first batch this process trains."""
        if self.startup is None:
            return on_batch

        def first(count: int) -> None:
            if self.startup is not None:
                self.startup.mark("first_batch")
                self.log(self.startup.record())
                self.startup = None
            on_batch(count)
        return first

    def synchronize(self) -> None:
        """Wait for every device's queued work (CUDA graphs and streams return before the GPU is done)."""
        for device in self.devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

    def _state_commit_due(self) -> bool:
        """Whether to commit between two buffer states: out of core, once ``training.checkpoint_interval``
        seconds have passed."""
        return self.spans.commits_between_states and self.checkpointer.due_between_states()

    def _commit_between_states(self, epoch: int, num_states: int, states_done: int, total_loss: torch.Tensor,
                               generators: list[torch.Generator]) -> None:
        """Commit the first ``states_done`` buffer states of the running epoch: a resumed run restarts
        at the next state with the same random draws, so a crash loses at most one state's work."""
        self.synchronize()
        self.partition_buffer().write_resident()
        self.state.states_done, self.state.partial_loss_sum = states_done, float(total_loss)
        self._commit(is_best=False, position=self.checkpointer.position_of(epoch, num_states, generators))

    def _check_position(self) -> None:
        """A mid-epoch version resumes only with the walk and devices it was committed with (checked before
        anything of the run is rewritten)."""
        if self.state.states_done:
            epoch = self.state.epoch + 1
            self.checkpointer.restore_position(epoch, self.ordering(epoch).num_states,
                                              flat(self._epoch_generators(epoch)))

    def _epoch_generators(self, epoch: int) -> tuple:
        """(shuffles, negatives, dropout) generators of an epoch (``random_streams.epoch_generators``)."""
        return epoch_generators(self.config.training.seed, epoch, self.plan_device, self.device,
                                self.devices if self.multi_device else None)

    def evaluate(self, split: str) -> dict:
        if self._known is None and self.config.evaluation.protocol == "filtered":
            self._known = build_known_answers(self.dataset.all_known_edges(), self.dataset.num_relations)
        metrics = evaluate_split(self.model.decoder, self.node_table(), self.dataset, split,
                                 self.config.evaluation, self._known, self.config.training.seed)
        return {"event": "eval", "split": split, "epoch": self.state.epoch, **metrics}

    def _validate(self, counts: bool) -> None:
        """Validate and log; when ``counts``, update best and early-stopping state.

        Only validations on the ``evaluation.every`` schedule count, so a run
        split by a resume selects the same best checkpoint as one that was not.
        """
        metrics = self.evaluate("valid")
        self.log(metrics)
        self._say(f"epoch {self.state.epoch}: valid MRR {metrics['mrr']:.4f} "
                  f"Hits@10 {metrics['hits@10']:.4f}")
        if counts:
            self._count_validation(metrics["mrr"])
        self.callbacks.validation(metrics)

    def _count_validation(self, mrr: float) -> None:
        """Update the best validation and early stopping with a validation on schedule."""
        if mrr > self.state.best_mrr:
            self.state.best_mrr, self.state.best_epoch = mrr, self.state.epoch
            self.state.validations_without_improvement = 0
        else:
            self.state.validations_without_improvement += 1
        patience = self.config.evaluation.early_stopping_patience
        if patience and self.state.validations_without_improvement >= patience:
            self.state.stopped_early = True
            self._say(f"early stopping: no improvement in {patience} validations")

    def train(self) -> TrainingState:
        """Run the epochs left until ``training.epochs``, committing per ``training.checkpoint_interval``.

        On CPU, torch's deterministic algorithms are on while it runs: the
        parallel CPU kernel that accumulates gradients of repeated rows sums in
        a varying order otherwise, and Adagrad's first steps amplify that
        rounding into visibly different embeddings. (It costs no measurable
        speed here; the previous setting is restored afterwards.)
        """
        previous = (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled())
        if self.device.type == "cpu":
            set_deterministic_algorithms(True, warn_only=True)
        try:
            return self._train()
        finally:
            set_deterministic_algorithms(previous[0], warn_only=previous[1])

    def _train(self) -> TrainingState:
        t = self.config.training
        if self.dataset.metadata.num_train == 0:  # (not len(train): out of core, that would read every edge)
            raise MariusInputError("dataset has no training edges", path=self.dataset.directory)
        self.callbacks.start()
        if self.group.is_leader:
            self.log(self.plan.record())
        while self.state.epoch < t.epochs and not self.state.stopped_early and self.callbacks.stop is None:
            with tf32_matmuls(self.device.type == "cuda" and t.tf32):
                record = self.train_epoch(self.state.epoch + 1)
            self.state.epoch += 1
            record = self.spans.combine(self.group.all_gather(record))
            self._say(f"epoch {record['epoch']}: loss {record['loss']:.4f}, {record['edges_per_s']:,.0f} edges/s"
                      + (f" over {self.group.world_size} trainers" if self.group.world_size > 1 else "")
                      + f", {record['seconds']:.1f} s")
            self._finish_epoch(record)
        self._wait_for_commit()  # (training ends committed: a commit behind it, e.g. before a stop, is done)
        return self.state

    def _finish_epoch(self, record: dict) -> None:
        """After an epoch: validate on schedule (the leader, once every partition is in its store), commit
        when due, then log the epoch's record (after the commit: a crash before the next commit replays
        this epoch). The leader decides; every trainer takes part in the gather and the commit."""
        t, e = self.config.training, self.config.evaluation
        previous_best = self.state.best_epoch
        on_schedule = e.every > 0 and self.state.epoch % e.every == 0
        last = self.state.epoch >= t.epochs
        validates = self.dataset.metadata.num_valid > 0 and (on_schedule or last)
        seconds = record.setdefault("time", {})
        started = time.perf_counter()
        written_before = self._checkpoint_bytes()
        if validates or last:  # (the last version holds every partition in the leader's run directory)
            gathered = self.spans.gather_for_evaluation()
            if gathered:
                record["gathered"] = gathered
        if validates:
            if self.group.is_leader:
                self._validate(counts=on_schedule)
            self.state = self.group.broadcast(self.state)  # best epoch, early stopping
            seconds["validate"] = time.perf_counter() - started
        is_best = self.state.best_epoch != previous_best
        started = time.perf_counter()
        self._report_commits()
        committed = self.group.broadcast(self._commit_due(is_best))
        behind = self.commits_behind and not self._ending()  # (the last commit is waited for)
        if committed and behind and self.checkpointer.writing and not is_best:  # (a best version must exist)
            self.checkpointer.fold(self.state.epoch)
            record["commit_folded"], committed = True, False
        elif committed:
            self.save_checkpoint(is_best=is_best, behind=behind)
            seconds["commit"] = seconds.get("commit", 0.0) + time.perf_counter() - started  # (+ between states)
        if "io" in record:  # (resident partitions written for the evaluation and the commit)
            record["io"]["checkpoint_bytes_written"] += self._checkpoint_bytes() - written_before
        if self.group.is_leader:
            self.log(record)
            self.callbacks.epoch_end(record)
        self._stop_if_asked(committed)

    def _stop_if_asked(self, committed: bool) -> None:
        """Where a hook asked to stop (the leader's callbacks; every trainer learns it): commit the epoch if
        it was not, then log the stop. The stop is not checkpointed: a resume trains on."""
        self.callbacks.stop = self.group.broadcast(self.callbacks.stop)
        if self.callbacks.stop is None:
            return
        if not committed:
            self.save_checkpoint()
        if self.group.is_leader:
            self.log(self.callbacks.stop_record(self.state.epoch))

    def _checkpoint_bytes(self) -> int:
        """Bytes the buffer has written of resident partitions (for commits and evaluations), so far."""
        return self.buffer.counters.snapshot()["checkpoint_bytes_written"] if self.buffer is not None else 0

    def _commit_due(self, is_best: bool) -> bool:
        """Whether this epoch commits (``Checkpointer.due``; the last epoch, an early stop and a callback's
        stop always do)."""
        return self.checkpointer.due(is_best, self._ending())

    def _ending(self) -> bool:
        """Whether training ends after this epoch: the last, an early stop, or a callback's stop."""
        return (self.state.epoch >= self.config.training.epochs or self.state.stopped_early
                or self.callbacks.stop is not None)

    def load_best(self) -> None:
        """Make the best-validation checkpoint the live state, if there is one."""
        self._wait_for_commit()  # (a commit in flight may move the best pointer)
        best = self.run.best_version()
        if best is not None:
            self.restore(best)

    def close(self) -> None:
        """Release the span source (its buffer, a group's threads) and the runner's processes (a replica
        group's workers). Dirty resident partitions are dropped, not written: the live store may then hold
        older rows than training had, which is safe because every resume rebuilds it from a committed version."""
        self.checkpointer.close()  # (a commit in flight finishes: it writes the live store)
        if self.spans is not None:
            self.spans.close()
        self.runner.close()
        self.callbacks.end()  # (last: a callback's failure here leaves nothing unreleased)

    def _say(self, text: str) -> None:
        if self.progress:
            tqdm.write(text)
