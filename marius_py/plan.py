"""The plan: where a run's node tables live, chosen from the graph's size and the machine's memory.

Tiers, fastest first: one GPU's memory (several GPUs: a copy on each, or a share on each), pinned host
memory, and disk behind a partition buffer. The plan takes the first tier the tables fit in. On disk it
chooses, among the partitions P and buffers C that fit in the memory there is, those whose ordering trains
each partition in the fewest buffer states per epoch (what out-of-core accuracy follows), then the fewest
bytes moved (the IO simulator's count; a smaller P where a larger one saves little), and the rows are
stored in bfloat16 (``storage.dtype=auto``). What the user gave (``storage.num_partitions``,
``storage.buffer_capacity``, ``pipeline.placement``, ``storage.dtype``) is kept; the plan fills in the
rest, prints what it chose and the memory the run will use, and the run's config.yaml pins it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from marius_py.config import Config, StorageLayout, dedup_setting, device_list, epoch_ordering, run_layout
from marius_py.errors import MariusInputError
from marius_py.orderings import Ordering, is_two_level, simulate
from marius_py.orderings.simulator import format_bytes
from marius_py.pipeline.placements import (DEVICE_MEMORY_FRACTION, PLACEMENT_CPU, PLACEMENT_DEVICE,
                                           PLACEMENT_HOST, PLACEMENT_REPLICATED, PLACEMENT_SPLIT,
                                           choose_devices_placement, choose_placement)
from marius_py.storage.buffer import PartitionBuffer
from marius_py.storage.partitioning import partition_size, partitions_filled

GiB = 1 << 30
HOST_FRACTION = 0.7              # of available host memory the tables (or the buffer) may take
EDGE_BYTES = 3 * 8               # a train edge held in memory: head, relation, tail as int64
RSS_MARGIN = GiB                 # disk tier's host bound: buffer + this + STATE_EDGE_BYTES per edge of a state
STATE_EDGE_BYTES = 200           # (the bound bench/larger_than_memory.py checks peak RSS against)
PARTITION_CANDIDATES = (4, 8, 16, 32, 64, 128, 256)
MIN_GROUP_SIZE = 4               # a two-level ordering's groups the plan accepts
BUSY_PARTITIONS = 4              # per torchrun trainer, where the plan chooses P (fewer: they wait for grants)
PREFERRED_MOST_PARTITIONS = 64  # more only where no smaller count fits: every state drains the pipeline
MIN_PARTITION_BYTES = 32 << 20   # smaller partitions are read and written below the disk's speed
IO_TOLERANCE = 1.1               # a larger P is chosen only if its epoch moves 10% fewer bytes
STATES_TOLERANCE = 0.05          # states per partition this close to the fewest count as as few

TIER_GPU, TIER_HOST, TIER_DISK = "gpu", "host", "disk"


@dataclass(frozen=True)
class GraphSize:
    """What the tables' size depends on."""

    num_nodes: int
    num_train: int
    dim: int
    state_dim: int  # optimizer state per row: 1 (row-wise Adagrad) or dim

    @classmethod
    def of(cls, config: Config, num_nodes: int, num_train: int) -> "GraphSize":
        state_dim = 1 if config.training.adagrad_variant == "rowwise" else config.model.dim
        return cls(num_nodes, num_train, config.model.dim, state_dim)

    def table_bytes(self, itemsize: int) -> int:
        return self.num_nodes * (self.dim + self.state_dim) * itemsize

    @property
    def edge_bytes(self) -> int:
        return self.num_train * EDGE_BYTES


@dataclass(frozen=True)
class Machine:
    """The memory a run may use: each training GPU's free bytes (none on a CPU), host memory available,
    and free disk where the run directory is (None: not known)."""

    gpu_free: tuple[int, ...] = ()
    host_available: int | None = None
    disk_free: int | None = None

    @classmethod
    def probe(cls, devices: list, run_dir: str | os.PathLike | None) -> "Machine":
        from marius_py.resources import available_memory
        import torch
        gpus = tuple(torch.cuda.mem_get_info(d)[0] for d in devices if d.type == "cuda")
        return cls(gpus, available_memory(), _disk_free(run_dir))

    @property
    def device_type(self) -> str:
        return "cuda" if self.gpu_free else "cpu"


def _disk_free(run_dir) -> int | None:
    """Free bytes on the file system that holds (or will hold) ``run_dir``."""
    path = Path(run_dir if run_dir is not None else ".").absolute()
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    try:
        return shutil.disk_usage(existing).free if existing is not None else None
    except OSError:
        return None


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
    host_bytes: int             # bound on host memory: tables or the buffer's (staging) slots, edges, a margin
    disk_bytes: int             # the store
    machine: Machine
    chosen: tuple[str, ...]     # keys the plan chose (the others were given)
    notes: tuple[str, ...] = field(default=())

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
                "disk_bytes": self.disk_bytes, "chosen": list(self.chosen),
                "machine": {"gpu_free": list(self.machine.gpu_free), "host_available": self.machine.host_available,
                            "disk_free": self.machine.disk_free}}

    def describe(self) -> str:
        """The lines ``marius-py train`` and ``marius-py plan`` print."""
        s = self.layout
        if self.tier == TIER_DISK:
            stored = f" (stored as {s.num_partitions})" if s.partition_split > 1 else ""
            where = "GPU" if self.placement == PLACEMENT_DEVICE else "host"
            head = (f"plan: tables on disk, {self.num_partitions} partitions{stored} through a buffer of "
                    f"{self.buffer_capacity} in {where} memory; {s.ordering} ordering, {s.dtype} rows")
        else:
            where = {PLACEMENT_DEVICE: "one GPU's memory", PLACEMENT_REPLICATED: "GPU memory, a copy on each GPU",
                     PLACEMENT_SPLIT: "GPU memory, a share on each GPU", PLACEMENT_HOST: "pinned host memory",
                     PLACEMENT_CPU: "host memory"}[self.placement]
            head = f"plan: tables in {where}, {s.dtype} rows"
        memory = [f"GPU {_gib(self.gpu_bytes)} each" if self.gpu_bytes else None,
                  f"host at most {_gib(self.host_bytes)}",
                  f"disk {_gib(self.disk_bytes)}" + (f" of {_gib(self.machine.disk_free)} free"
                                                     if self.machine.disk_free is not None else "")]
        lines = [head, f"  tables {_gib(self.table_bytes)}; memory: " + ", ".join(m for m in memory if m)]
        if self.chosen:
            lines.append("  chosen by the plan: " + ", ".join(self.chosen) + " (set them to override)")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _gib(num_bytes: float) -> str:
    return format_bytes(num_bytes)


def plan_run(config: Config, graph: GraphSize, machine: Machine, world_size: int = 1) -> Plan:
    """The plan of ``config``'s run on ``machine`` (``world_size``: torchrun trainers sharing the tables)."""
    s = config.storage
    if world_size > 1 or _under_torchrun():
        return _trainers_plan(config, graph, machine, world_size)
    if s.num_partitions == 0:
        return _memory_plan(config, graph, machine, required=False) or _disk_plan(config, graph, machine)
    if s.num_partitions == 1:
        return _memory_plan(config, graph, machine, required=True)
    return _disk_plan(config, graph, machine)


def _under_torchrun() -> bool:
    from marius_py.distributed.group import launched_by_torchrun  # (the package imports the trainer)
    return launched_by_torchrun()


def _with_storage(config: Config, **values) -> Config:
    return dataclasses.replace(config, storage=dataclasses.replace(config.storage, **values))


def _limit(config: Config) -> float:
    """``storage.memory_limit_gib`` in bytes (infinite when 0)."""
    gib = config.storage.memory_limit_gib
    return gib * GiB if gib > 0 else float("inf")


def _host_budget(config: Config, machine: Machine) -> float:
    available = machine.host_available
    return min(_limit(config), HOST_FRACTION * available if available is not None else float("inf"))


def _several(config: Config) -> bool:
    return len(device_list(config.training.devices)) > 1


def _chosen(config: Config, keys: tuple[str, ...], machine: Machine) -> tuple[str, ...]:
    """The keys the plan chose (the user left them automatic); where the tables live matters only on GPUs."""
    s = config.storage
    if not machine.gpu_free:
        keys = tuple(key for key in keys if key != "pipeline.placement")
    given = {"storage.num_partitions": s.num_partitions > 0, "storage.buffer_capacity": s.buffer_capacity > 0,
             "storage.dtype": s.dtype != "auto", "pipeline.placement": config.pipeline.placement != "auto"}
    return tuple(key for key in keys if not given[key])


def _memory_plan(config: Config, graph: GraphSize, machine: Machine, required: bool) -> Plan | None:
    """Tables wholly in GPU or host memory; None where they fit in neither (unless ``required``: the user
    asked for memory; the plan then says it may not fit)."""
    planned = _with_storage(config, num_partitions=1, buffer_capacity=0)
    layout = run_layout(planned, graph.num_nodes)
    table = graph.table_bytes(_itemsize(layout))
    fits_limit = table <= _limit(config)
    placement = _memory_placement(config, machine, table if fits_limit else float("inf"))
    on_gpu = placement in (PLACEMENT_DEVICE, PLACEMENT_REPLICATED, PLACEMENT_SPLIT)
    host = graph.edge_bytes + (0 if on_gpu else table)
    fits = on_gpu or (fits_limit and host <= _host_budget(config, machine))
    if not fits and not required:
        return None
    notes = () if fits else (f"the tables ({_gib(table)}) may not fit in the host memory available; "
                             "storage.num_partitions=0 lets the plan put them on disk",)
    gpus = max(len(machine.gpu_free), 1)
    gpu = table // gpus if placement == PLACEMENT_SPLIT else table if on_gpu else 0
    return Plan(TIER_GPU if on_gpu else TIER_HOST, placement, 1, 0, layout, table, 0, gpu, host + RSS_MARGIN,
                table, machine, _chosen(config, ("storage.num_partitions", "pipeline.placement"), machine), notes)


def _memory_placement(config: Config, machine: Machine, table_bytes: float) -> str:
    p = config.pipeline
    if _several(config):
        return choose_devices_placement(p.placement, machine.device_type, table_bytes, list(machine.gpu_free),
                                        partitioned=False, dedup=dedup_setting(p.dedup) is not False)
    return choose_placement(p.placement, machine.device_type, table_bytes, _first(machine.gpu_free))


def _first(values: tuple[int, ...]) -> int:
    return values[0] if values else 0


def _itemsize(layout: StorageLayout) -> int:
    return 2 if layout.dtype == "bfloat16" else 4


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
    host_bytes: int   # bound on host memory: the buffer's slots (or its staging), a state's edges, the margin
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
    return Plan(TIER_DISK, best.placement, best.num_partitions, best.buffer_capacity, best.layout, table,
                best.buffer_bytes, best.buffer_bytes if on_gpu else 0, best.host_bytes, table, machine,
                _chosen(config, ("storage.num_partitions", "storage.buffer_capacity", "storage.dtype",
                                 "pipeline.placement"), machine), _disk_notes(machine, table))


def _disk_notes(machine: Machine, table: int) -> tuple[str, ...]:
    free = machine.disk_free
    if free is not None and free < table:
        raise MariusInputError(f"the store needs {_gib(table)} on disk but only {_gib(free)} is free where the "
                               "run directory is", expected="a run directory (--run-dir) on a disk with room")
    if free is not None and free < 2 * table:
        return (f"committed versions may need up to {_gib(table)} more disk than the {_gib(free)} free",)
    return ()


def _partition_counts(config: Config, graph: GraphSize) -> list[list[int]]:
    """P given, or the candidates (in two rounds: up to 64, then more) whose partitions all hold nodes and
    are large enough to move at disk speed."""
    if config.storage.num_partitions > 1:
        return [[config.storage.num_partitions]]
    table = graph.table_bytes(4)
    counts = [p for p in PARTITION_CANDIDATES if partitions_filled(graph.num_nodes, p) == p
              and (p == PARTITION_CANDIDATES[0] or table // p >= MIN_PARTITION_BYTES)]
    return [[p for p in counts if p <= PREFERRED_MOST_PARTITIONS], [p for p in counts if p > PREFERRED_MOST_PARTITIONS]]


def _fitting_buffers(config: Config, graph: GraphSize, machine: Machine, num_partitions: int) -> list[_Candidate]:
    """The buffers of ``num_partitions`` (or the one given) whose slots and a state's edges fit, with where each
    lives, its epoch's IO and its states per partition; those whose groups regroup (``_regroups``) where any
    fit."""
    given = config.storage.buffer_capacity
    fitting = [c for c in (_fitted(config, graph, machine, num_partitions, capacity)
                           for capacity in ([given] if given else range(num_partitions, 1, -1))) if c is not None]
    regrouping = [c for c in fitting if _regroups(c.layout)]
    return fitting if given else regrouping or fitting


def _fitted(config: Config, graph: GraphSize, machine: Machine, num_partitions: int,
            capacity: int) -> _Candidate | None:
    """P:C with where its buffer lives, None where its slots and a state's edges fit nowhere (a buffer the
    user gave goes where the placement says: the trainer refuses one host memory cannot hold)."""
    layout = run_layout(_with_storage(config, num_partitions=num_partitions, buffer_capacity=capacity),
                        graph.num_nodes)
    slots = buffer_bytes(layout, graph, config.storage.lookahead)
    share = layout.buffer_capacity / layout.num_partitions
    edges_bytes = RSS_MARGIN + STATE_EDGE_BYTES * int(graph.num_train * share * share)  # (the first state trains
    placement = _buffer_placement(config, machine, slots, edges_bytes)                # every bucket it holds)
    if config.storage.buffer_capacity and placement is None:
        placement = PLACEMENT_HOST if _several(config) else choose_placement(
            config.pipeline.placement, machine.device_type, slots, _first(machine.gpu_free))
    if placement is None:
        return None
    host = edges_bytes + slots  # (a GPU buffer's pinned staging slots too)
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


def _buffer_placement(config: Config, machine: Machine, slots: int, edges_bytes: int) -> str | None:
    """Where a buffer of ``slots`` bytes lives (GPU or host memory), None where it does not fit. Host memory holds
    its slots either way (a GPU buffer stages its swaps through as many pinned slots) and a state's edges
    (``edges_bytes``)."""
    available = machine.host_available
    host_room = HOST_FRACTION * available if available is not None else float("inf")
    if slots > _limit(config) or slots + edges_bytes > host_room:
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
    host = "unknown" if machine.host_available is None else _gib(machine.host_available)
    return MariusInputError(f"the node tables ({_gib(table)}) fit neither in memory nor behind a partition buffer "
                            f"(host memory available: {host}; GPU free: "
                            f"{', '.join(map(_gib, machine.gpu_free)) or 'none'})",
                            expected="more partitions (storage.num_partitions), a larger storage.memory_limit_gib, "
                                     "or a smaller model.dim")


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
    world = max(world_size if world_size > 1 else int(os.environ.get("WORLD_SIZE", "1")), 1)
    p = s.num_partitions or BUSY_PARTITIONS * world
    layout = run_layout(_with_storage(config, num_partitions=p), graph.num_nodes)
    buffer = trainer_buffer_bytes(layout, graph, partitions_per_trainer(config, layout.num_partitions, world))
    placement = choose_placement(config.pipeline.placement, machine.device_type, buffer, _first(machine.gpu_free))
    on_gpu = placement == PLACEMENT_DEVICE
    table = graph.table_bytes(_itemsize(layout))
    return Plan(TIER_DISK, placement, p, s.buffer_capacity, layout, table, buffer, buffer if on_gpu else 0,
                buffer + RSS_MARGIN, table, machine,
                _chosen(config, ("storage.num_partitions", "pipeline.placement"), machine))


def plan_dataset(config: Config, dataset, run_dir=None, world_size: int = 1, machine: Machine | None = None) -> Plan:
    """The plan of ``config``'s run on ``dataset`` (``machine``: this one's memory for the run's devices, and the
    disk of ``run_dir``, by default)."""
    from marius_py.devices import resolve_devices
    graph = GraphSize.of(config, dataset.num_nodes, dataset.metadata.num_train)
    return plan_run(config, graph, machine or Machine.probe(resolve_devices(config), run_dir), world_size)
