"""Several devices train one model from one set of host tables, with deduplicated row transfers.

A span's edges (a buffer state, or an in-memory epoch) are dealt to the G
devices in steps: step k gives device g the batch ``k * G + g``. Each device
plans its batch (negatives, unique rows) and computes its gradients; relation
parameters are replicated on every device. The node tables stay in
host memory (pinned: GPU kernels read and write them in place, or a partition
buffer's slots), and with deduplication (``pipeline.routing``):

1. each device groups its rows by owner (``row % G``) and sends each owner
   the rows it needs; the owner takes their union;
2. the owner reads each row of the union once: from its ``RowCache`` (rows it
   keeps for the span: intra-GPU reuse) or from the host over PCIe; it sends
   every device the rows it asked for (peer copies over NVLink);
3. the devices compute their gradients; each returns the gradients of the
   rows it got to their owners; relation gradients are all-reduced (summed
   in device order on every replica) and every replica takes the same step;
4. each owner applies, per row, the G devices' gradients as consecutive
   Adagrad steps in device order, in one read-modify-write (``node_update``).

Without deduplication (``pipeline.dedup=false``, the baseline) every device
reads its own rows from the host and applies its own update, in device order:
the same arithmetic, so both train the same model (tests compare them).

The loop plans steps ``lookahead`` ahead (row counts reach the host without a
stall) and lets a step's loads run while up to ``staleness_bound - 1`` earlier
steps still compute: a load may read rows those steps have not updated yet,
but every update is a read-modify-write of the current row, so none is lost.
On CUDA each device has a plan, a load and a compute stream ordered by events;
on a CPU the same code runs inline, so G simulated devices test the routing.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.device_cache import RowCache, hot_rows
from pipeline.routing import GroupedRows, OwnerRows, TransferCounters, group_by_owner, owner_offsets, union_of_requests
from pipeline.row_kernels import gather_rows
from pipeline.step import BatchStep

PLAN_LOOKAHEAD = 4  # steps planned ahead of the one that loads


@dataclass
class _Lanes:
    """A device's streams: planning, loading (host reads and sends), compute and update; None on a CPU."""

    plan: torch.cuda.Stream | None
    load: torch.cuda.Stream | None
    compute: torch.cuda.Stream | None

    @classmethod
    def for_device(cls, device: torch.device) -> "_Lanes":
        if device.type != "cuda":
            return cls(None, None, None)
        return cls(*(torch.cuda.Stream(device) for _ in range(3)))


def _on(*streams: torch.cuda.Stream | None):
    """Make each stream current on its device (nothing for CPU lanes)."""
    stack = contextlib.ExitStack()
    for stream in streams:
        if stream is not None:
            stack.enter_context(torch.cuda.stream(stream))
    return stack


def _record(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _wait(stream: torch.cuda.Stream | None, events) -> None:
    if stream is not None:
        for event in events:
            if event is not None:
                stream.wait_event(event)


def _used_on(stream: torch.cuda.Stream | None, *tensors: torch.Tensor) -> None:
    """Tensors made on another stream of the same device, used on ``stream``: keep them until it is done."""
    if stream is not None:
        for tensor in tensors:
            tensor.record_stream(stream)


def group_steps_by_head(edges: torch.Tensor, step_edges: int, num_devices: int, window_steps: int) -> torch.Tensor:
    """Step grouping (HongTu's chunk reorganisation in spirit): batches that run together share rows.

    Each window of ``window_steps`` steps is sorted by head, so a step's edges
    have few distinct heads, and every step's edges are dealt round-robin to
    its devices, so those heads are shared by all of them: a step reads fewer
    rows, and more of them serve several devices. Steps stop being uniform
    samples of the span: measure accuracy (bench/multi_gpu.py).
    """
    parts = []
    for start in range(0, len(edges), window_steps * step_edges):
        window = edges[start:start + window_steps * step_edges]
        window = window[torch.sort(window[:, 0], stable=True).indices]
        for first in range(0, len(window), step_edges):
            step = window[first:first + step_edges]
            parts.append(step[torch.cat([torch.arange(g, len(step), num_devices) for g in range(num_devices)])])
    return torch.cat(parts) if parts else edges


@dataclass
class _Step:
    """One step in flight: its batches, plans and routes, then what its loads produced."""

    index: int
    batches: list[torch.Tensor]
    plans: list = field(default_factory=list)
    grouped: list[GroupedRows] = field(default_factory=list)
    per_owner: list = field(default_factory=list)     # [G] counts per device: device tensors, then numpy
    planned: list = field(default_factory=list)       # events of the plan streams
    owners: list[OwnerRows] = field(default_factory=list)
    inputs: list[torch.Tensor] = field(default_factory=list)
    loaded: list = field(default_factory=list)        # events: inputs ready on each device
    updated: list = field(default_factory=list)       # events of the updates

    @property
    def active(self) -> int:
        """Devices with a batch in this step (the span's last step may not fill them all)."""
        return len(self.batches)

    def counts(self, device: int) -> np.ndarray:
        return self.per_owner[device]


class MultiDeviceRunner:
    """Trains spans of edges on ``devices`` from host tables (see the module docstring)."""

    def __init__(self, steps: list[BatchStep], node_update: Callable, devices: list[torch.device], batch_size: int,
                 staleness_bound: int, dedup: bool = True, cache_rows: int = 0, cache_all: bool = False,
                 shared_negatives: bool = False, grouping_window: int = 0):
        """``steps[g]``: device g's step (its own relation replica). ``node_update(nodes, state, rows,
        grads, count, cache)``: the in-place optimizer update of rows (``row_kernels.sparse_adagrad_``).
        ``cache_rows``: rows each owner keeps per span (its hottest); ``cache_all``: all it owns (tables
        split across the devices' memory). ``grouping_window``: steps whose edges ``group_steps_by_head``
        reorders together (0: the span's order)."""
        if len(steps) != len(devices) or len(devices) < 2:
            raise ValueError("a multi-device runner needs one step per device and at least two devices")
        self.steps, self.node_update, self.devices = steps, node_update, devices
        self.batch_size, self.staleness_bound = batch_size, max(1, staleness_bound)
        self.dedup, self.cache_rows, self.cache_all = dedup, cache_rows, cache_all
        self.shared_negatives, self.grouping_window = shared_negatives, grouping_window
        self.lanes = [_Lanes.for_device(d) for d in devices]
        self.counters = TransferCounters()
        self.caches: list[RowCache | None] = [None] * len(devices)
        self.max_in_flight = 0

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def effective_staleness(self) -> int:
        """Steps whose loads may run before an earlier step's updates (1: synchronous)."""
        return self.staleness_bound

    @property
    def caching(self) -> bool:
        return self.dedup and (self.cache_all or self.cache_rows > 0)

    # ---- a span ----
    def run(self, edges: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor, candidates,
            sampling: list[torch.Generator], dropout: list[torch.Generator], loss_sum: torch.Tensor,
            on_batch: Callable[[int], None]) -> None:
        """Train ``edges`` (host, already shuffled, ids index the host tables) in steps of G batches."""
        step_edges = self.batch_size * self.num_devices
        if self.grouping_window:
            edges = group_steps_by_head(edges, step_edges, self.num_devices, self.grouping_window)
        if any(d.type == "cuda" for d in self.devices):
            edges = edges.pin_memory()  # batches copy to their devices asynchronously
        self._admit_caches(edges, nodes, state)
        for device, lanes in zip(self.devices, self.lanes):  # after what the caller queued (zeroed loss, caches)
            for stream in (lanes.plan, lanes.load, lanes.compute):
                if stream is not None:
                    stream.wait_stream(torch.cuda.current_stream(device))
        candidates = [None if candidates is None else candidates.to(d) for d in self.devices]
        losses = [torch.zeros((), device=d) for d in self.devices]
        num_steps = -(-len(edges) // step_edges)
        planned: deque[_Step] = deque()
        in_flight: deque[_Step] = deque()
        finished: deque[_Step] = deque()
        context = (nodes, state, candidates, sampling, dropout, losses)
        for index in range(num_steps + PLAN_LOOKAHEAD):
            if index < num_steps:
                span = edges[index * step_edges:(index + 1) * step_edges]
                planned.append(self._plan(index, span, context))
            if planned and (len(planned) > PLAN_LOOKAHEAD or index >= num_steps):
                step = planned.popleft()
                self._load(step, finished, context)
                in_flight.append(step)
                self.max_in_flight = max(self.max_in_flight, len(in_flight))
                if len(in_flight) >= self.staleness_bound:
                    finished.append(self._finish(in_flight.popleft(), context, on_batch))
        while in_flight:
            finished.append(self._finish(in_flight.popleft(), context, on_batch))
        for device, lanes in zip(self.devices, self.lanes):
            if lanes.compute is not None:
                torch.cuda.current_stream(device).wait_stream(lanes.compute)
        self._flush_caches(nodes, state)
        for loss in losses:
            loss_sum.add_(loss.to(loss_sum.device))

    # ---- caches ----
    def _admit_caches(self, edges: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor) -> None:
        if not self.caching:
            return
        rows, dim, state_dim = len(nodes), nodes.shape[1], state.shape[1]
        for owner, device in enumerate(self.devices):
            if self.cache_all:
                chosen = torch.arange(owner, rows, self.num_devices)
            else:
                chosen = hot_rows(edges, rows, owner, self.num_devices, self.cache_rows)
            cache = self.caches[owner]
            if cache is None or len(cache.slot_of) != rows or cache.capacity < len(chosen):
                cache = self.caches[owner] = RowCache.empty(rows, max(len(chosen), self.cache_rows), dim,
                                                            state_dim, device, nodes.dtype)
            moved = cache.admit(chosen, nodes, state)
            self.counters.rows_host_to_device += len(chosen)
            self.counters.bytes_host_to_device += moved

    def _flush_caches(self, nodes: torch.Tensor, state: torch.Tensor) -> None:
        for cache in self.caches:
            if cache is not None and cache.num_rows:
                self.counters.rows_device_to_host += cache.num_rows
                self.counters.bytes_device_to_host += cache.flush(nodes, state)

    # ---- the three phases of a step ----
    def _plan(self, index: int, span: torch.Tensor, context) -> _Step:
        """Per device: copy its batch over, draw negatives, find its rows and group them by owner."""
        nodes, _, candidates, sampling, _, _ = context
        batches = [span[start:start + self.batch_size] for start in range(0, len(span), self.batch_size)]
        step = _Step(index, batches)
        shared = None
        for g, batch in enumerate(batches):
            device, lanes, model = self.devices[g], self.lanes[g], self.steps[g]
            with _on(self.lanes[0].plan, lanes.plan):  # device 0's too: shared draws are copied from there
                batch = batch.to(device, non_blocking=True)
                draws = model.negative_draws(len(batch), candidates[g], sampling[g])
                if self.shared_negatives and shared is None:
                    shared = draws
                elif self.shared_negatives:
                    draws = self._share_uniform_draws(draws, shared, device)
                plan = model.plan_batch(batch, None, candidates[g], defer_count=True, draws=draws,
                                        table_rows=len(nodes))
                grouped = group_by_owner(plan.rows, plan.local, plan.unique_count, self.num_devices)
                step.plans.append(plan.routed(grouped.rows, grouped.local))
                step.grouped.append(grouped)
                step.per_owner.append(self._counts_to_host(grouped.per_owner))
                step.planned.append(_record(lanes.plan))
        return step

    @staticmethod
    def _share_uniform_draws(draws: list, shared: list, device: torch.device) -> list:
        """The step's first device draws the uniform negatives every device of the step uses."""
        if any(d[0].shape != s[0].shape for d, s in zip(draws, shared)):
            return draws  # a shorter last batch has fewer chunks
        return [(uniform.to(device, non_blocking=True), picks) for (uniform, _), (_, picks) in zip(shared, draws)]

    @staticmethod
    def _counts_to_host(per_owner: torch.Tensor):
        if per_owner.device.type != "cuda":
            return per_owner
        host = torch.empty(per_owner.shape, dtype=per_owner.dtype, pin_memory=True)
        return host.copy_(per_owner, non_blocking=True)

    def _load(self, step: _Step, finished: deque, context) -> None:
        """Each device's rows of the step, on that device: through the owners, or each from the host."""
        nodes, state = context[0], context[1]
        for event in step.planned:
            if event is not None:
                event.synchronize()  # planned steps ago: the counts are on the host
        step.per_owner = [p.numpy() for p in step.per_owner]
        stale_by = [s for s in finished if s.index == step.index - self.staleness_bound]
        reads_after = stale_by[0].updated if stale_by else []
        while finished and finished[0].index <= step.index - self.staleness_bound:
            finished.popleft()
        counts = [int(c.sum()) for c in step.per_owner]
        self.counters.device_rows += sum(counts)
        self.counters.steps += 1
        if self.dedup:
            self._load_through_owners(step, nodes, reads_after, counts)
        else:
            self._load_each_from_host(step, nodes, state, reads_after, counts)

    def _load_each_from_host(self, step: _Step, nodes, state, reads_after, counts) -> None:
        row_bytes = (nodes.shape[1] + state.shape[1]) * nodes.element_size()
        for g in range(step.active):
            lanes, device = self.lanes[g], self.devices[g]
            with _on(lanes.load):
                _wait(lanes.load, step.planned + reads_after)
                rows = step.grouped[g].rows
                inputs = gather_rows(nodes, rows, torch.empty(counts[g], nodes.shape[1], dtype=nodes.dtype,
                                                              device=device), counts[g])
                _used_on(lanes.load, rows)
                step.inputs.append(inputs)
                step.loaded.append(_record(lanes.load))
            self.counters.rows_host_to_device += counts[g]
            self.counters.bytes_host_to_device += counts[g] * (nodes.shape[1] * nodes.element_size() + row_bytes)
            self.counters.rows_device_to_host += counts[g]
            self.counters.bytes_device_to_host += counts[g] * row_bytes

    def _load_through_owners(self, step: _Step, nodes, reads_after, counts) -> None:
        """Owners take the union of the requests, read it once, and send each device its rows."""
        dim, element = nodes.shape[1], nodes.element_size()
        offsets = [owner_offsets(step.counts(g)) for g in range(step.active)]
        blocks: list[list[torch.Tensor]] = [[] for _ in range(step.active)]
        for owner, device in enumerate(self.devices):
            lanes = self.lanes[owner]
            with _on(lanes.load):
                _wait(lanes.load, step.planned + reads_after)
                requests = []
                for g in range(step.active):
                    start, size = int(offsets[g][owner]), int(step.counts(g)[owner])
                    with _on(self.lanes[g].load):
                        _wait(self.lanes[g].load, step.planned)
                        _used_on(self.lanes[g].load, step.grouped[g].rows)
                        requests.append(step.grouped[g].rows[start:start + size].to(device, non_blocking=True))
                    if g == owner:
                        _used_on(lanes.load, step.grouped[g].rows)
                union = union_of_requests(requests)
                cache = self.caches[owner]
                read = gather_rows(nodes, union.rows, torch.empty(len(union.rows), dim, dtype=nodes.dtype,
                                                                   device=device), union.count, cache)
                hits = None
                if cache is not None and cache.num_rows:
                    real = torch.arange(len(union.rows), device=device) < union.count
                    hits = ((cache.slot_of[union.rows] >= 0) & real).sum()
                self.counters.add_owner_step(union.count, hits)
                step.owners.append(union)
                for g in range(step.active):
                    with _on(self.lanes[g].load):
                        blocks[g].append(read[union.positions[g]].to(self.devices[g], non_blocking=True))
                    if g != owner:
                        sent = len(union.positions[g])
                        self.counters.rows_device_to_device += sent
                        self.counters.bytes_device_to_device += sent * (2 * dim * element + 8)
        for g in range(step.active):
            lanes = self.lanes[g]
            with _on(lanes.load):
                step.inputs.append(torch.cat(blocks[g]) if blocks[g] else torch.empty(0, dim, device=self.devices[g]))
                step.loaded.append(_record(lanes.load))

    def _finish(self, step: _Step, context, on_batch) -> _Step:
        """Gradients on every device, relation steps on every replica, then the node updates."""
        nodes, state, _, _, dropout, losses = context
        gradients, relation_grads, computed = [], [], []
        for g in range(step.active):
            lanes, plan = self.lanes[g], step.plans[g]
            with _on(lanes.compute):
                _wait(lanes.compute, step.loaded[g:g + 1])
                _used_on(lanes.compute, step.inputs[g], *plan.tensors())
                grad, rel, loss = self.steps[g].gradients(plan, step.inputs[g], dropout[g])
                losses[g].add_(loss * len(plan.edges))
                gradients.append(grad[:int(step.counts(g).sum())])
                relation_grads.append(rel)
                computed.append(_record(lanes.compute))
        self._step_relations(relation_grads, computed)
        if self.dedup:
            self._update_through_owners(step, nodes, state, gradients, computed)
        else:
            self._update_each(step, nodes, state, gradients)
        on_batch(step.active)
        return step

    def _step_relations(self, relation_grads: list[list[torch.Tensor]], computed) -> None:
        """All-reduce: every replica sums the devices' relation gradients (in device order, so every sum is
        the same) and takes one optimizer step; the replicas stay equal."""
        for d, device in enumerate(self.devices):
            lanes = self.lanes[d]
            with _on(lanes.compute):
                _wait(lanes.compute, computed)
                summed = None
                for h, grads in enumerate(relation_grads):
                    with _on(self.lanes[h].compute):
                        moved = [grad.to(device, non_blocking=True) for grad in grads]
                    summed = moved if summed is None else [a + b for a, b in zip(summed, moved)]
                    if h != d:
                        self.counters.bytes_device_to_device += sum(g.numel() * g.element_size() for g in grads)
                self.steps[d].step_relations([summed])

    def _update_through_owners(self, step: _Step, nodes, state, gradients, computed) -> None:
        dim = nodes.shape[1]
        for owner, device in enumerate(self.devices):
            lanes, union = self.lanes[owner], step.owners[owner]
            with _on(lanes.compute):
                _wait(lanes.compute, computed + step.loaded)
                _used_on(lanes.compute, union.rows, union.count, *union.positions)
                stacked = torch.zeros(step.active, len(union.rows), dim, dtype=nodes.dtype, device=device)
                for g in range(step.active):
                    start = int(owner_offsets(step.counts(g))[owner])
                    size = int(step.counts(g)[owner])
                    with _on(self.lanes[g].compute):
                        block = gradients[g][start:start + size].to(device, non_blocking=True)
                    stacked[g].index_copy_(0, union.positions[g], block)
                self.node_update(nodes, state, union.rows, stacked, union.count, cache=self.caches[owner])
                step.updated.append(_record(lanes.compute))

    def _update_each(self, step: _Step, nodes, state, gradients) -> None:
        previous = []
        for g in range(step.active):
            lanes = self.lanes[g]
            with _on(lanes.compute):
                _wait(lanes.compute, previous)  # device order, as the owners apply them
                count = int(step.counts(g).sum())
                self.node_update(nodes, state, step.grouped[g].rows, gradients[g], count, cache=None)
                previous = [_record(lanes.compute)]
        step.updated.extend(previous)
