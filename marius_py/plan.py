"""The plan: where a run's node tables live, chosen from the graph's size and the machine's memory.

Tiers, fastest first: one GPU's memory (several GPUs: a copy on each, or a share on each), pinned host
memory, and disk behind a partition buffer. The plan takes the first tier the run fits in. On disk it
chooses, among the partitions P and buffers C that fit in the memory there is, those whose ordering trains
each partition in the fewest buffer states per epoch (what out-of-core accuracy follows), then the fewest
bytes moved (the IO simulator's count; a smaller P where a larger one saves little), and the rows are
stored in bfloat16 (``storage.dtype=auto``); the ordering is ``storage.ordering``'s. What the user gave
(``storage.num_partitions``, ``storage.buffer_capacity``, ``pipeline.placement``, ``storage.dtype``) is
kept; the plan fills in the rest, prints what it chose and the memory the run will use, and the run's
config.yaml pins it.

Host memory, the bound the plan prints and fits in: the tables (in memory; a GPU's are read through host
memory when a run resumes) or the buffer's slots (a GPU buffer stages its swaps through as many pinned
ones), the train edges in memory (or one buffer state's), filtered evaluation's known answers, and a margin.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from marius_py import evaluation
from marius_py.checkpoint import LIVE_STORE
from marius_py.config import Config, StorageConfig, dedup_setting, device_list
from marius_py.config_validation import MOST_STORED_PARTITIONS, check_threads
from marius_py.errors import MariusInputError
from marius_py.layout import StorageLayout, epoch_ordering, run_layout
from marius_py.optim import adagrad_state_dim
from marius_py.orderings import Ordering, is_two_level, simulate
from marius_py.orderings.simulator import format_bytes
from marius_py.pipeline.placements import (DEVICE_MEMORY_FRACTION, PLACEMENT_CPU, PLACEMENT_DEVICE,
                                           PLACEMENT_HOST, PLACEMENT_REPLICATED, PLACEMENT_SPLIT,
                                           choose_devices_placement, choose_placement, default_staleness)
from marius_py.resources import check_nodes_fill
from marius_py.storage.buffer import PartitionBuffer
from marius_py.storage.partitioning import partition_size, partitions_filled

GiB = 1 << 30
HOST_FRACTION = 0.7              # of available host memory a run may take
RSS_MARGIN = GiB                 # the process itself: libraries, the model, staging pieces
TRAIN_EDGE_BYTES = 64            # a train edge in memory: pinned, and a shuffled copy (measured ~50 B on a CPU)
STATE_EDGE_BYTES = 200           # a state's edge: read (two arrays), mapped, shuffled (measured 70-120 B, one array)
KNOWN_EDGE_BYTES = 56            # filtered evaluation: the train edges and the known answers of every edge
PARTITION_CANDIDATES = (4, 8, 16, 32, 64, 128, 256)
MIN_GROUP_SIZE = 4               # a two-level ordering's groups the plan prefers
BUSY_PARTITIONS = 4              # per torchrun trainer, where the plan chooses P (fewer: they wait for grants)
PREFERRED_MOST_PARTITIONS = 64   # more only where no smaller count fits: every state drains the pipeline
MIN_PARTITION_BYTES = 32 << 20   # a bfloat16 partition smaller than this is read and written below disk speed
IO_TOLERANCE = 1.1               # a larger P is chosen only if its epoch moves 10% fewer bytes
STATES_TOLERANCE = 0.05          # states per partition this close to the fewest count as as few
VERSIONS = 3                     # stores a run's disk holds at most: the live one, the latest and the best

TIER_GPU, TIER_HOST, TIER_DISK = "gpu", "host", "disk"


@dataclass(frozen=True)
class GraphSize:
    """What the run's memory depends on, of the graph and the model."""

    num_nodes: int
    num_train: int
    dim: int
    state_dim: int         # optimizer state per row: 1 (row-wise Adagrad) or dim
    evaluated_edges: int   # edges filtered evaluation keeps known answers of (0: sampled, or no split to test)

    @classmethod
    def of(cls, config: Config, num_nodes: int, num_train: int, num_eval: int = 0) -> "GraphSize":
        """``num_eval``: the valid and test edges."""
        filtered = config.evaluation.protocol == "filtered" and num_eval > 0
        return cls(num_nodes, num_train, config.model.dim,
                   adagrad_state_dim(config.training.adagrad_variant == "rowwise", config.model.dim),
                   num_train + num_eval if filtered else 0)

    @classmethod
    def of_dataset(cls, config: Config, dataset) -> "GraphSize":
        m = dataset.metadata
        return cls.of(config, dataset.num_nodes, m.num_train, m.num_valid + m.num_test)

    def table_bytes(self, itemsize: int) -> int:
        return self.num_nodes * (self.dim + self.state_dim) * itemsize

    @property
    def evaluation_bytes(self) -> int:
        """Filtered evaluation's host memory: the known answers, and its working pieces (a chunk of queries'
        rows, a batch's scores, a block of the store)."""
        if not self.evaluated_edges:
            return 0
        working = evaluation.QUERY_ROWS_BYTES + evaluation.SCORE_BYTES + 2 * evaluation.StoredNodes.BLOCK_BYTES
        return self.evaluated_edges * KNOWN_EDGE_BYTES + working


@dataclass(frozen=True)
class Machine:
    """The memory a run may use: each training GPU's free bytes (none on a CPU), host memory available,
    and free disk where the run directory is (None: not known)."""

    gpu_free: tuple[int, ...] = ()
    host_available: int | None = None
    disk_free: int | None = None
    cores: int | None = None  # CPU cores (None: not known)

    @classmethod
    def probe(cls, devices: list, run_dir: str | os.PathLike | None) -> "Machine":
        from marius_py.resources import available_memory
        import torch
        gpus = tuple(torch.cuda.mem_get_info(d)[0] for d in devices if d.type == "cuda")
        return cls(gpus, available_memory(), _disk_free(run_dir), os.cpu_count())

    @property
    def device_type(self) -> str:
        return "cuda" if self.gpu_free else "cpu"

    @property
    def host_room(self) -> float:
        return HOST_FRACTION * self.host_available if self.host_available is not None else math.inf


def _disk_free(run_dir) -> int | None:
    """Bytes the run's store may take on the file system that holds (or will hold) ``run_dir``: what is free, and
    what a store already there (a resumed run's) takes."""
    path = Path(run_dir if run_dir is not None else ".").absolute()
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    try:
        free = shutil.disk_usage(existing).free if existing is not None else None
    except OSError:
        return None
    store = path / LIVE_STORE
    held = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) if store.is_dir() else 0
    return None if free is None else free + held


@dataclass(frozen=True)
class Plan:
    """Where the tables live and what the run will use; ``applied`` gives the config that trains it."""

    tier: str
    placement: str              # pipeline placement: cpu, device, host, replicated or split
    num_partitions: int         # as storage.num_partitions counts them (the store may split each)
    buffer_capacity: int        # likewise (0 in memory)
    layout: StorageLayout       # the physical store
    table_bytes: int            # the node tables in the store's dtype
    buffer_bytes: int           # the partition buffer's slots (0 in memory)
    gpu_bytes: int              # tables or buffer held on each GPU
    host_bytes: int             # bound on host memory (module docstring)
    disk_bytes: int             # the store
    machine: Machine
    chosen: tuple[str, ...]     # keys the plan chose (the others were given)
    notes: tuple[str, ...] = field(default=())
    trainers: int = 1           # torchrun trainers sharing the store
    held_per_trainer: int = 0   # (several trainers: the partitions each holds at once)
    commits_behind: bool = False  # commits written on a thread while training goes on (host_bytes holds a
                                  # snapshot of in-memory tables)

    def applied(self, config: Config) -> Config:
        """``config`` with the plan's partitions and buffer (what config.yaml pins for a resume)."""
        storage = dataclasses.replace(config.storage, num_partitions=self.num_partitions,
                                      buffer_capacity=self.buffer_capacity)
        return dataclasses.replace(config, storage=storage)

    def record(self) -> dict:
        """The plan as the metrics log keeps it."""
        return {"event": "plan", "tier": self.tier, "placement": self.placement,
                "num_partitions": self.num_partitions, "buffer_capacity": self.buffer_capacity,
                "physical_partitions": self.layout.num_partitions, "physical_buffer": self.layout.buffer_capacity,
                "ordering": self.layout.ordering, "dtype": self.layout.dtype, "table_bytes": self.table_bytes,
                "buffer_bytes": self.buffer_bytes, "gpu_bytes": self.gpu_bytes, "host_bytes": self.host_bytes,
                "disk_bytes": self.disk_bytes, "chosen": list(self.chosen), "trainers": self.trainers,
                "commits_behind": self.commits_behind,
                "machine": {"gpu_free": list(self.machine.gpu_free), "host_available": self.machine.host_available,
                            "disk_free": self.machine.disk_free}}

    def describe(self) -> str:
        """The lines ``marius-py train`` and ``marius-py plan`` print."""
        s = self.layout
        where = "GPU" if self.placement == PLACEMENT_DEVICE else "host"
        if self.trainers > 1:
            head = (f"plan: tables on the disks of {self.trainers} trainers, {self.num_partitions} partitions, "
                    f"each trainer holding {self.held_per_trainer} in {where} memory; {s.dtype} rows")
        elif self.tier == TIER_DISK:
            stored = f" (stored as {s.num_partitions})" if s.partition_split > 1 else ""
            head = (f"plan: tables on disk, {self.num_partitions} partitions{stored} through a buffer of "
                    f"{self.buffer_capacity} in {where} memory; {s.ordering} ordering, {s.dtype} rows")
        else:
            where = {PLACEMENT_DEVICE: "one GPU's memory", PLACEMENT_REPLICATED: "GPU memory, a copy on each GPU",
                     PLACEMENT_SPLIT: "GPU memory, a share on each GPU", PLACEMENT_HOST: "pinned host memory",
                     PLACEMENT_CPU: "host memory"}[self.placement]
            head = f"plan: tables in {where}, {s.dtype} rows"
        memory = [f"GPU {_size(self.gpu_bytes)} each" if self.gpu_bytes else None,
                  f"host at most {_size(self.host_bytes)}",
                  f"disk {_size(self.disk_bytes)}" + (f" of {_size(self.machine.disk_free)} free"
                                                      if self.machine.disk_free is not None else "")]
        commits = "written behind training" if self.commits_behind else "synchronous"
        lines = [head, f"  tables {_size(self.table_bytes)}; memory: " + ", ".join(m for m in memory if m)
                 + f"; commits {commits}"]
        if self.chosen:
            lines.append("  chosen by the plan: " + ", ".join(self.chosen) + " (set them to override)")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _size(num_bytes: float) -> str:
    return format_bytes(num_bytes)


def plan_run(config: Config, graph: GraphSize, machine: Machine, world_size: int = 1,
             torchrun: bool = False) -> Plan:
    """The plan of ``config``'s run on ``machine`` (``world_size``: torchrun trainers sharing the tables;
    ``torchrun``: whether the run's trainers are a torchrun group, a group of one included, as the entry point
    that started the run knows)."""
    if machine.cores:
        check_threads(config, machine.cores)
    plan = _tables_plan(config, graph, machine, world_size, torchrun)
    _check_batches(config, graph, plan)
    return dataclasses.replace(plan, notes=plan.notes + _step_notes(config))


def _step_notes(config: Config) -> tuple[str, ...]:
    """Which step trains where the fused one (training.fused_step) cannot: a plug-in without its kernels."""
    from marius_py.step.fused import fused_step_refusal  # (torch and the kernels: only once a run is planned)
    refusal = fused_step_refusal(config) if config.training.fused_step else None
    return (f"fused step off: {refusal}; every batch runs the autograd step",) if refusal else ()


def _tables_plan(config: Config, graph: GraphSize, machine: Machine, world_size: int, torchrun: bool) -> Plan:
    s = config.storage
    check_nodes_fill(s.num_partitions, graph.num_nodes, "storage.num_partitions")
    if world_size > 1 or torchrun:
        return _trainers_plan(config, graph, machine, world_size)
    if s.num_partitions == 0:
        return _memory_plan(config, graph, machine, required=False) or _disk_plan(config, graph, machine)
    if s.num_partitions == 1:
        return _memory_plan(config, graph, machine, required=True)
    return _disk_plan(config, graph, machine)


def _with_storage(config: Config, **values) -> Config:
    return dataclasses.replace(config, storage=dataclasses.replace(config.storage, **values))


def _limit(config: Config) -> float:
    """``storage.memory_limit_gib`` in bytes (infinite when 0)."""
    gib = config.storage.memory_limit_gib
    return gib * GiB if gib > 0 else math.inf


def _several(config: Config) -> bool:
    return len(device_list(config.training.devices)) > 1


def _first(values: tuple[int, ...]) -> int:
    return values[0] if values else 0


def _itemsize(layout: StorageLayout) -> int:
    return 2 if layout.dtype == "bfloat16" else 4


def _chosen(config: Config, keys: tuple[str, ...], machine: Machine) -> tuple[str, ...]:
    """The keys the plan chose (the user left them automatic); where the tables live matters only on GPUs."""
    s = config.storage
    if not machine.gpu_free:
        keys = tuple(key for key in keys if key != "pipeline.placement")
    given = {"storage.num_partitions": s.num_partitions > 0, "storage.buffer_capacity": s.buffer_capacity > 0,
             "storage.dtype": s.dtype != "auto", "pipeline.placement": config.pipeline.placement != "auto"}
    return tuple(key for key in keys if not given[key])


def _notes(config: Config, graph: GraphSize, machine: Machine, store: int, host: int,
           versions: int = VERSIONS) -> tuple[str, ...]:
    """What may not fit, said before the run starts (a store the disk cannot hold is refused). ``versions``:
    the stores the disk may hold at once."""
    free, notes = machine.disk_free, []
    if free is not None and free < store:
        raise MariusInputError(f"the store needs {_size(store)} on disk but only {_size(free)} is free where the "
                               "run directory is", expected="a run directory (--run-dir) on a disk with room")
    if free is not None and free < versions * store:
        notes.append(f"committed versions may need up to {_size(versions * store)} of disk, {_size(free)} is free")
    if host > machine.host_room:
        notes.append(f"the run may need {_size(host)} of host memory, more than "
                     f"{HOST_FRACTION:.0%} of the {_size(machine.host_available)} available")
    if graph.evaluation_bytes > machine.host_room / 2:
        notes.append(f"filtered evaluation keeps {_size(graph.evaluation_bytes)} of known answers in host memory; "
                     "evaluation.protocol=sampled keeps none")
    return tuple(notes)


# ---- a step's batches ----

def _check_batches(config: Config, graph: GraphSize, plan: Plan) -> None:
    """Refuse negatives, or a staleness bound, whose batches cannot fit in memory (a huge value would crash
    the run rather than fail cleanly). Both checks count lower bounds: float32 rows, no gradients."""
    t = config.training
    edges = t.batch_size if _several(config) else min(t.batch_size, graph.num_train)  # (several shape full ones)
    chunks, negatives = min(t.num_chunks, edges), graph.num_nodes if t.num_negatives == -1 else t.num_negatives
    _check_step(config, graph, plan.machine, edges, chunks, negatives)
    in_flight = 1 if plan.placement == PLACEMENT_DEVICE else \
        min(default_staleness(plan.placement, config.pipeline.staleness_bound), -(-graph.num_train // edges))
    rows = 4 * graph.dim * (2 * edges + chunks * negatives)  # (a batch's endpoints and negatives, gathered)
    room = plan.machine.host_room
    if config.pipeline.staleness_bound and in_flight * rows > room:
        raise MariusInputError(f"pipeline.staleness_bound: {in_flight:,} batches in flight hold "
                               f"{_size(in_flight * rows)} of rows, more than the {_size(room)} of host memory "
                               "a run may take", expected=f"at most {int(room // rows):,} batches in flight")


def _check_step(config: Config, graph: GraphSize, machine: Machine, edges: int, chunks: int, negatives: int) -> None:
    """One step's scores (a batch of ``edges`` against its negatives) and negative rows on its device."""
    t = config.training
    per_negative = (2 if t.score_dtype == "bfloat16" else 4) * edges + chunks * (4 * graph.dim + 8)  # (+ ids)
    room = min(machine.gpu_free) if machine.gpu_free else machine.host_room
    if negatives * per_negative <= room:
        return
    fitting = int(room // per_negative)
    given = f"{negatives:,} negatives" if t.num_negatives != -1 else f"all {negatives:,} nodes"
    raise MariusInputError(f"{'training.num_negatives' if fitting else 'training.batch_size'}: a step's scores and "
                           f"rows of {edges:,} edges against {given} need {_size(negatives * per_negative)}, more "
                           f"than the {_size(room)} of "
                           f"{'GPU memory free' if machine.gpu_free else 'host memory a run may take'}",
                           expected=f"at most {fitting:,} negatives (training.num_negatives) with this batch"
                                    if fitting else "a smaller training.batch_size")


# ---- tables in memory ----

def _memory_plan(config: Config, graph: GraphSize, machine: Machine, required: bool) -> Plan | None:
    """Tables wholly in GPU or host memory; None where they do not fit (unless ``required``: the user asked
    for memory; the plan then notes what may not fit)."""
    planned = _with_storage(config, num_partitions=1, buffer_capacity=0)
    layout = run_layout(planned, graph.num_nodes)
    table = graph.table_bytes(_itemsize(layout))
    fits_limit = table <= _limit(config)
    placement = _memory_placement(config, machine, table if fits_limit else math.inf)
    # (host memory holds the tables in every placement: split ones live there, a GPU's pass through it when
    # a run resumes)
    host = table + TRAIN_EDGE_BYTES * graph.num_train + graph.evaluation_bytes + RSS_MARGIN
    if not (fits_limit and host <= machine.host_room) and not required:
        return None
    on_gpu = placement in (PLACEMENT_DEVICE, PLACEMENT_REPLICATED, PLACEMENT_SPLIT)
    gpu = table // max(len(machine.gpu_free), 1) if placement == PLACEMENT_SPLIT else table if on_gpu else 0
    # A commit behind training writes a copy of the tables: a GPU's into the host memory its resume reads
    # through (counted above; the snapshot's is given back before a restore reads them), tables in host
    # memory (split ones included) into as much again.
    snapshot = 0 if placement in (PLACEMENT_DEVICE, PLACEMENT_REPLICATED) else table
    behind, notes = _commits_behind(config, machine, host, snapshot)
    host += snapshot if behind else 0
    return Plan(TIER_GPU if on_gpu else TIER_HOST, placement, 1, 0, layout, table, 0, gpu, host, table, machine,
                _chosen(config, ("storage.num_partitions", "pipeline.placement"), machine),
                _notes(config, graph, machine, table, host) + notes, commits_behind=behind)


def _commits_behind(config: Config, machine: Machine, host: int, snapshot: int) -> tuple[bool, tuple[str, ...]]:
    """Whether commits are written behind training (``training.commits_behind``; auto: where host memory holds
    the ``snapshot`` bytes beside ``host``), with the note that says why not where auto chose synchronous."""
    setting = config.training.commits_behind
    if setting != "auto":
        return setting == "true", ()
    if host + snapshot <= machine.host_room:
        return True, ()
    return False, (f"commits are synchronous: a snapshot of the tables behind training needs {_size(snapshot)} "
                   "more host memory than there is",)


def _memory_placement(config: Config, machine: Machine, table_bytes: float) -> str:
    p = config.pipeline
    if _several(config):
        return choose_devices_placement(p.placement, machine.device_type, table_bytes, list(machine.gpu_free),
                                        partitioned=False, dedup=dedup_setting(p.dedup) is not False)
    return choose_placement(p.placement, machine.device_type, table_bytes, _first(machine.gpu_free))


# ---- tables on disk ----

def buffer_bytes(layout: StorageLayout, graph: GraphSize, lookahead: int) -> int:
    """The partition buffer's slots for ``layout`` (its lookahead slots included)."""
    rows = partition_size(graph.num_nodes, layout.num_partitions)
    return PartitionBuffer.bytes_needed(rows, (graph.dim, graph.state_dim), layout.buffer_capacity,
                                        layout.swap_size, lookahead, itemsize=_itemsize(layout))


@dataclass(frozen=True)
class _Candidate:
    num_partitions: int
    buffer_capacity: int
    layout: StorageLayout
    buffer_bytes: int
    host_bytes: int   # bound on host memory (module docstring)
    placement: str
    io_bytes: int     # read and written in one epoch
    states_per_partition: float  # buffer states a partition trains in per epoch (mean): the accuracy cost


def _disk_plan(config: Config, graph: GraphSize, machine: Machine) -> Plan:
    """Tables on disk behind a partition buffer: P and C (unless given) that fit, fewest states per partition
    first (accuracy), then the least IO."""
    candidates = []
    for counts in _partition_counts(config, graph):  # (larger counts only if no smaller one fits)
        candidates = [c for p in counts for c in _fitting_buffers(config, graph, machine, p)]
        if candidates:
            break
    if not candidates:
        raise _no_fit(config, graph, machine)
    fewest = min(c.states_per_partition for c in candidates)
    accurate = [c for c in candidates if c.states_per_partition <= fewest + STATES_TOLERANCE]
    least = min(c.io_bytes for c in accurate)
    best = next(c for c in accurate if c.io_bytes <= IO_TOLERANCE * least)  # (ascending P, then descending C)
    on_gpu = best.placement == PLACEMENT_DEVICE
    table = graph.table_bytes(_itemsize(best.layout))
    # A commit behind training snapshots by linking the store's files (no memory); while it is written, the
    # buffer's write-backs replace the live files it links: one more store on disk at worst.
    behind = config.training.commits_behind != "false"
    return Plan(TIER_DISK, best.placement, best.num_partitions, best.buffer_capacity, best.layout, table,
                best.buffer_bytes, best.buffer_bytes if on_gpu else 0, best.host_bytes, table, machine,
                _chosen(config, ("storage.num_partitions", "storage.buffer_capacity", "storage.dtype",
                                 "pipeline.placement"), machine),
                _notes(config, graph, machine, table, best.host_bytes, versions=VERSIONS + behind),
                commits_behind=behind)


def _partition_counts(config: Config, graph: GraphSize) -> list[list[int]]:
    """P given, or the candidates (in two rounds: up to 64, then more) whose partitions (split as the user
    gave) all hold nodes and, stored in bfloat16, are large enough to move at disk speed."""
    if config.storage.num_partitions > 1:
        return [[config.storage.num_partitions]]
    table, split = graph.table_bytes(2), max(config.storage.partition_split, 1)  # (a split the user gave stays)
    counts = [p for p in PARTITION_CANDIDATES if partitions_filled(graph.num_nodes, p * split) == p * split
              and p * split <= MOST_STORED_PARTITIONS
              and (p == PARTITION_CANDIDATES[0] or table // p >= MIN_PARTITION_BYTES)]
    return [[p for p in counts if p <= PREFERRED_MOST_PARTITIONS], [p for p in counts if p > PREFERRED_MOST_PARTITIONS]]


def _fitting_buffers(config: Config, graph: GraphSize, machine: Machine, num_partitions: int) -> list[_Candidate]:
    """The buffers of ``num_partitions`` (or the one given) that fit, with where each lives, its epoch's IO and
    its states per partition; those whose groups regroup (``_regroups``) where any fit."""
    given = config.storage.buffer_capacity
    fitting = [c for c in (_fitted(config, graph, machine, num_partitions, capacity)
                           for capacity in ([given] if given else range(num_partitions, 1, -1))) if c is not None]
    regrouping = [c for c in fitting if _regroups(c.layout)]
    return fitting if given else regrouping or fitting


def _fitted(config: Config, graph: GraphSize, machine: Machine, num_partitions: int,
            capacity: int) -> _Candidate | None:
    """P:C with where its buffer lives, None where it fits nowhere (a buffer the user gave goes where the
    placement says, and the plan notes what may not fit: the trainer refuses a buffer host memory cannot
    hold)."""
    layout = run_layout(_with_storage(config, num_partitions=num_partitions, buffer_capacity=capacity),
                        graph.num_nodes)
    slots = buffer_bytes(layout, graph, config.storage.lookahead)
    share = layout.buffer_capacity / layout.num_partitions
    state_edges = int(graph.num_train * share * share)  # (the first state trains every bucket it holds)
    host = slots + STATE_EDGE_BYTES * state_edges + graph.evaluation_bytes + RSS_MARGIN
    placement = _buffer_placement(config, machine, slots, host)
    if config.storage.buffer_capacity and placement is None:
        placement = PLACEMENT_HOST if _several(config) else choose_placement(
            config.pipeline.placement, machine.device_type, slots, _first(machine.gpu_free))
    if placement is None:
        return None
    ordering = epoch_ordering(layout, config.training.seed, 1)
    return _Candidate(num_partitions, capacity, layout, slots, host, placement, _epoch_io(ordering, layout, graph),
                      _states_per_partition(ordering))


def _states_per_partition(ordering: Ordering) -> float:
    """Mean count of the states each (logical) partition is resident in: the out-of-core gap in accuracy grows
    with it, whatever share of the nodes is resident (docs/design.md)."""
    return sum(len(state) for state in ordering.states) / ordering.num_partitions


def _regroups(layout: StorageLayout) -> bool:
    """Whether a two-level ordering gets groups of at least ``MIN_GROUP_SIZE`` to regroup every epoch (smaller
    groups lose most of what regrouping recovers of in-memory accuracy: docs/design.md; a graph too small to
    split its partitions finely may allow none)."""
    return not is_two_level(layout.ordering) or layout.buffer_capacity >= layout.num_partitions \
        or layout.group_size >= MIN_GROUP_SIZE


def _buffer_placement(config: Config, machine: Machine, slots: int, host: int) -> str | None:
    """Where a buffer of ``slots`` bytes lives (GPU or host memory), None where it does not fit: its slots within
    ``storage.memory_limit_gib``, the run's ``host`` bytes in host memory (a GPU buffer stages its swaps
    through as many pinned slots), and a GPU's share for tables."""
    if slots > _limit(config) or host > machine.host_room:
        return None
    if _several(config):
        return PLACEMENT_HOST
    placement = choose_placement(config.pipeline.placement, machine.device_type, slots, _first(machine.gpu_free))
    if placement == PLACEMENT_DEVICE and slots > DEVICE_MEMORY_FRACTION * _first(machine.gpu_free):
        return None
    return placement


def _epoch_io(ordering: Ordering, layout: StorageLayout, graph: GraphSize) -> int:
    """Bytes one epoch of ``ordering`` reads and writes (the IO simulator, at the physical layout)."""
    row_bytes = (graph.dim + graph.state_dim) * _itemsize(layout)
    stats = simulate(ordering, partition_size(graph.num_nodes, layout.num_partitions) * row_bytes)
    return stats.bytes_read + stats.bytes_written


def _no_fit(config: Config, graph: GraphSize, machine: Machine) -> MariusInputError:
    layout = run_layout(_with_storage(config, num_partitions=max(config.storage.num_partitions, 2)), graph.num_nodes)
    table = graph.table_bytes(_itemsize(layout))
    host = "unknown" if machine.host_available is None else _size(machine.host_available)
    limit = f"storage.memory_limit_gib={config.storage.memory_limit_gib:g}; " \
        if config.storage.memory_limit_gib > 0 else ""
    evaluation = (f"; filtered evaluation keeps {_size(graph.evaluation_bytes)} of known answers in host memory "
                  "(evaluation.protocol=sampled keeps none)") if graph.evaluation_bytes else ""
    lookahead = config.storage.lookahead
    ahead = (f"; storage.lookahead={lookahead} adds {lookahead:,} partitions (or groups) to the buffer"
             if lookahead > StorageConfig().lookahead else "")
    return MariusInputError(f"the node tables ({_size(table)}) fit neither in memory nor behind a partition buffer "
                            f"({limit}host memory available: {host}; GPU free: "
                            f"{', '.join(map(_size, machine.gpu_free)) or 'none'}){evaluation}{ahead}",
                            expected="more memory, a larger storage.memory_limit_gib, more partitions "
                                     "(storage.num_partitions), sampled evaluation, a smaller model.dim"
                                     + (" or a smaller storage.lookahead" if ahead else ""))


# ---- several torchrun trainers ----

def partitions_per_trainer(config: Config, num_partitions: int, num_trainers: int) -> int:
    """``distributed.partitions_per_trainer``, automatic (0): as many as leave half the partitions free, at least
    2 (simulated epochs, ``orderings.grant_simulation``: trainers holding more than half of them idle)."""
    chosen = config.distributed.partitions_per_trainer or max(2, num_partitions // (2 * num_trainers))
    return min(chosen, num_partitions)


def trainer_buffer_bytes(layout: StorageLayout, graph: GraphSize, capacity: int) -> int:
    """A torchrun trainer's buffer: ``capacity`` slots and as many spare (the next grant is filled while the
    last one's partitions are written back)."""
    rows = partition_size(graph.num_nodes, layout.num_partitions)
    return PartitionBuffer.bytes_needed(rows, (graph.dim, graph.state_dim), capacity, capacity, 1,
                                        itemsize=_itemsize(layout))


def _trainers_plan(config: Config, graph: GraphSize, machine: Machine, world_size: int) -> Plan:
    """Several torchrun trainers share the tables by partition: P (unless given) is BUSY_PARTITIONS per
    trainer, so that trainers seldom wait for one another's partitions, each holding
    ``partitions_per_trainer``."""
    s = config.storage
    world = max(world_size, 1)
    p = s.num_partitions or BUSY_PARTITIONS * world
    check_nodes_fill(p, graph.num_nodes, "storage.num_partitions")
    layout = run_layout(_with_storage(config, num_partitions=p), graph.num_nodes, torchrun=True)
    held = partitions_per_trainer(config, layout.num_partitions, world)
    buffer = trainer_buffer_bytes(layout, graph, held)
    placement = choose_placement(config.pipeline.placement, machine.device_type, buffer, _first(machine.gpu_free))
    on_gpu = placement == PLACEMENT_DEVICE
    table = graph.table_bytes(_itemsize(layout))
    share = held / layout.num_partitions
    host = buffer + STATE_EDGE_BYTES * int(graph.num_train * share * share) + graph.evaluation_bytes + RSS_MARGIN
    # (the leader's disk takes every partition at the last epoch; another trainer's about its share)
    return Plan(TIER_DISK, placement, p, s.buffer_capacity, layout, table, buffer, buffer if on_gpu else 0,
                host, table, machine, _chosen(config, ("storage.num_partitions", "pipeline.placement"), machine),
                _notes(config, graph, machine, table, host), trainers=world, held_per_trainer=held)
