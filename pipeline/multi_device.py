"""Several devices train one model from one set of host tables, with deduplicated row transfers.

A span's edges (a buffer state, or an in-memory epoch) are dealt to the G
devices in steps: step k gives device g the batch ``k * G + g``. Relation
parameters are replicated on every device. The node tables stay in host memory
(pinned: GPU kernels read and write them in place; or a partition buffer's
slots). A step runs in five phases, each on every device:

1. plan: the device draws its negatives, finds its unique rows and groups
   them by owner (``row % G``, ``pipeline.routing``);
2. read: each owner takes the union of the rows the devices request from it
   and reads each row once, from its ``RowCache`` (rows it keeps for the
   span: intra-GPU reuse) or from the host over PCIe;
3. compute: each device pulls its rows from their owners (NVLink) and
   computes its gradients;
4. relations: relation gradients are all-reduced (summed in device order on
   every replica) and every replica takes the same step;
5. update: each owner pulls the gradients of its rows and applies, per row,
   the devices' gradients as consecutive Adagrad steps in device order, in one
   read-modify-write.

Without deduplication (``dedup=False``, the baseline) every device reads its
own rows from the host, and each owner applies every device's gradients of its
rows one device after the other, a read-modify-write each, reading the rows'
ids and gradients from the device that computed them: the same arithmetic, so
both train the same model (tests compare them), and no update waits for another
device's (the updates' reads of the host are not deduplicated either).

Rows move by ``move_rows``, a kernel on the receiving device that reads the
sender's memory directly, with counts and offsets left where they were
computed: no phase waits for the host. Plan and load run on a device's load
stream, compute and the relation step on its compute stream, the node update on
its update stream (so it overlaps the next step's compute), ordered across
devices by events; a step's loads may run while up to ``staleness_bound - 1`` earlier
steps still compute (a load may then read rows they have not updated yet, but
every update is a read-modify-write of the current row, so none is lost). On
CUDA with the fused step, full steps are replayed as one CUDA graph per phase
and device (``PhaseGraphs``): a step then costs the host a few launches. On a
CPU the same code runs inline, so G simulated devices test the routing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from marius_py.pipeline.device_cache import RowCache, endpoint_degree, hot_rows
from marius_py.pipeline.lanes import Lanes, StepState, enable_peer_access, on, put, record, wait
from marius_py.pipeline.phase_graphs import GRAPH_STALENESS, PhaseGraphs
from marius_py.pipeline.routing import (CACHE_HITS, UNION_ROWS, TransferCounters, group_by_owner,
                                        group_steps_by_head, union_of_requests)
from marius_py.pipeline.row_kernels import gather_rows, move_rows, triton_available, zero_copy_available
from marius_py.pipeline.step import BatchStep

DEFAULT_STALENESS = 2  # steps in flight: the next step's reads overlap this one's compute
AUTO_WARM_STEPS, AUTO_TIMED_STEPS = 4, 12  # dedup=auto: steps of each mode run before timing, and timed


class MultiDeviceRunner:
    """Trains spans of edges on ``devices`` from host tables (see the module docstring)."""

    def __init__(self, steps: list[BatchStep], node_update: Callable, devices: list[torch.device], batch_size: int,
                 staleness_bound: int, dedup: bool | str = True, cache_rows: int = 0, cache_all: bool = False,
                 shared_negatives: bool = False, grouping_window: int = 0, graphs: bool = False):
        """``steps[g]``: device g's step (its own relation replica). ``node_update(nodes, state, rows,
        grads, count, cache=, present=)``: the in-place optimizer update of rows (``row_kernels.sparse_adagrad_``).
        ``cache_rows``: rows each owner keeps per span (its hottest); ``cache_all``: all it owns (tables
        split across the devices' memory, kept there across spans of the same tables). ``grouping_window``:
        steps whose edges ``group_steps_by_head`` reorders together (0: the span's order). ``graphs``:
        replay full steps as CUDA graphs where ``PhaseGraphs.supported``."""
        if len(steps) != len(devices) or not devices:
            raise ValueError("a multi-device runner needs one step per device")
        self.steps, self.node_update, self.devices = steps, node_update, devices
        self.batch_size, self.staleness_bound = batch_size, max(1, staleness_bound)
        self.auto = dedup == "auto"  # time a few steps of each mode in the first long span, keep the faster
        self.dedup, self.cache_rows, self.cache_all = bool(dedup), cache_rows, cache_all
        self.dedup_trial: dict | None = None  # seconds per step of each mode, once auto has chosen
        self.shared_negatives, self.grouping_window = shared_negatives, grouping_window
        self.lanes = [Lanes.for_device(d) for d in devices]
        enable_peer_access(devices)
        self.counters = TransferCounters(devices, self.dedup)
        self.losses = [torch.zeros((), device=d) for d in devices]
        self.caches: list[RowCache | None] = [None] * len(devices)
        self._cached_tables = None  # (nodes, state) whose rows the caches hold across spans (cache_all)
        self.graphs = PhaseGraphs(self) if graphs and PhaseGraphs.supported(self) else None
        self.max_in_flight = 0
        self.host_seconds = None  # (not measured here)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def effective_staleness(self) -> int:
        """Steps whose loads may run before an earlier step's updates (1: synchronous)."""
        return min(self.staleness_bound, GRAPH_STALENESS) if self.graphs is not None else self.staleness_bound

    @property
    def zero_copy(self) -> bool:
        """Whether GPU kernels read and write the (pinned) host tables in place: on GPUs with Triton."""
        return self.devices[0].type == "cuda" and zero_copy_available()

    @property
    def caching(self) -> bool:
        return self.dedup and (self.cache_all or self.cache_rows > 0)

    def close(self) -> None:
        """Nothing to release: the lanes' streams and the caches go with the runner."""

    # ---- a span ----
    def run(self, edges: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor, candidates,
            sampling: list[torch.Generator], dropout: list[torch.Generator], loss_sum: torch.Tensor,
            on_batch: Callable[[int], None]) -> None:
        """Train ``edges`` (already shuffled, on the host or GPU 0; ids index the host tables) in steps of G
        batches.

        On return every update has reached the host tables (a partition buffer may evict their slots).
        """
        cuda = any(d.type == "cuda" for d in self.devices)
        if cuda and triton_available() and not (nodes.is_pinned() and state.is_pinned()):
            raise ValueError("several GPUs read and write the host tables in place: pin them (pin_memory())")
        step_edges = self.batch_size * self.num_devices
        if self.grouping_window:
            edges = group_steps_by_head(edges, step_edges, self.num_devices, self.grouping_window)
        if cuda and edges.device.type == "cpu" and not edges.is_pinned():
            edges = edges.pin_memory()  # batches copy to their devices asynchronously
        context = _SpanContext(nodes, state, [None if candidates is None else candidates.to(d) for d in self.devices],
                               sampling, dropout)
        self._admit_caches(edges, nodes, state)
        self._lanes_after_current()  # after what the caller queued (caches, relations)
        try:
            self._run_steps(edges, step_edges, context, on_batch)
        except BaseException:
            self._drop_caches()  # their rows may hold part of this span's updates: never write them back
            raise
        for device, lanes in zip(self.devices, self.lanes):
            for stream in (lanes.compute, lanes.update):
                if stream is not None:
                    torch.cuda.current_stream(device).wait_stream(stream)
        self._release_caches(nodes, state)
        for loss in self.losses:
            loss_sum.add_(loss.to(loss_sum.device))
            loss.zero_()
        for device in self.devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # kernels write the pinned tables (or slots) until here

    def _run_steps(self, edges: torch.Tensor, step_edges: int, context, on_batch) -> None:
        starts = list(range(0, len(edges), step_edges))
        trial = 2 * (AUTO_WARM_STEPS + AUTO_TIMED_STEPS)
        if not self.auto or len(starts) <= trial:  # (auto waits for a span long enough to time both)
            self._run_segment(edges, starts, 0, context, on_batch)
            return
        seconds, index = {}, 0
        for dedup in (True, False):  # each mode warmed up (kernels, graphs), then timed
            self._switch_dedup(dedup, edges, context)
            self._run_segment(edges, starts[index:index + AUTO_WARM_STEPS], index, context, on_batch)
            index += AUTO_WARM_STEPS
            timed = starts[index:index + AUTO_TIMED_STEPS]
            seconds[dedup] = self._seconds_per_step(lambda: self._run_segment(edges, timed, index, context,
                                                                              on_batch), len(timed))
            index += AUTO_TIMED_STEPS
        self.auto = False
        self.dedup_trial = {"seconds_per_step": {"dedup": seconds[True], "no_dedup": seconds[False]},
                            "chosen": seconds[True] <= seconds[False]}
        self._switch_dedup(self.dedup_trial["chosen"], edges, context)
        self._run_segment(edges, starts[index:], index, context, on_batch)

    def _seconds_per_step(self, run: Callable[[], None], steps: int) -> float:
        started = time.perf_counter()
        run()
        return (time.perf_counter() - started) / steps

    def _switch_dedup(self, dedup: bool, edges: torch.Tensor, context) -> None:
        """Between drained segments: the other mode (same arithmetic, other traffic). Cached rows go back to
        the host tables first, and graphs are captured again for the mode's phases."""
        if dedup == self.dedup:
            return
        self._release_caches(context.nodes, context.state)
        self.dedup = self.counters.dedup = dedup
        if self.graphs is not None:
            self.graphs = PhaseGraphs(self)
        self._admit_caches(edges, context.nodes, context.state)
        self._lanes_after_current()  # the caches' flush and admission (current streams) come first

    def _lanes_after_current(self) -> None:
        """Every lane's later work follows what each device's current stream has queued so far."""
        for device, lanes in zip(self.devices, self.lanes):
            for stream in (lanes.load, lanes.compute, lanes.update):
                if stream is not None:
                    stream.wait_stream(torch.cuda.current_stream(device))

    def _run_segment(self, edges: torch.Tensor, starts: list[int], first: int, context, on_batch) -> None:
        """Steps at ``starts`` (step ``first`` on), every one finished and every device synchronised on return."""
        bound, step_edges = self.effective_staleness, self.batch_size * self.num_devices
        in_flight: deque[StepState] = deque()
        done: deque[StepState] = deque()
        for index, start in enumerate(starts, first):
            batches = [edges[s:s + self.batch_size] for s in range(start, min(start + step_edges, len(edges)),
                                                                   self.batch_size)]
            reads_after = [e for s in done if s.index == index - bound for e in s.updated]
            in_flight.append(self._load(index, batches, context, reads_after))
            self.max_in_flight = max(self.max_in_flight, len(in_flight))
            if len(in_flight) >= bound:
                done.append(self._finish(in_flight.popleft(), context, on_batch))
            while len(done) > bound:
                done.popleft()
        while in_flight:
            self._finish(in_flight.popleft(), context, on_batch)
        for device in self.devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

    # ---- caches ----
    def _admit_caches(self, edges: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor) -> None:
        if not self.caching:
            return
        if self.cache_all and self._cached_tables is not None and self._cached_tables[0] is nodes \
                and self._cached_tables[1] is state:
            return  # the same tables as the last span: their rows are on the devices already
        self._forget_caches(nodes, state)
        rows, dim, state_dim = len(nodes), nodes.shape[1], state.shape[1]
        degree = None if self.cache_all else endpoint_degree(edges, rows)
        for owner, device in enumerate(self.devices):
            if self.cache_all:
                chosen = torch.arange(owner, rows, self.num_devices)
            else:
                chosen = hot_rows(degree, owner, self.num_devices, self.cache_rows)
            cache = self.caches[owner]
            if cache is None or len(cache.slot_of) != rows or cache.capacity < len(chosen):
                capacity = min(self.cache_rows, len(chosen) * 5 // 4 + 1) if not self.cache_all else len(chosen)
                cache = self.caches[owner] = RowCache.empty(rows, max(capacity, len(chosen)), dim, state_dim,
                                                            device, nodes.dtype)
            self.counters.admitted_bytes[owner] += cache.admit(chosen, nodes, state)
            self.counters.admitted_rows += len(chosen)
        self._cached_tables = (nodes, state) if self.cache_all else None

    def _release_caches(self, nodes: torch.Tensor, state: torch.Tensor) -> None:
        """End of a span: the host tables get every cached row back (split tables stay on the devices)."""
        if self.cache_all and self._cached_tables is not None:
            for owner, cache in enumerate(self.caches):
                self.counters.written_back_bytes[owner] += cache.write_back(nodes, state)
                self.counters.written_back_rows += cache.num_rows
        else:
            self._forget_caches(nodes, state)

    def _drop_caches(self) -> None:
        for cache in self.caches:
            if cache is not None:
                cache.forget()
        self._cached_tables = None

    def _forget_caches(self, nodes: torch.Tensor, state: torch.Tensor) -> None:
        for owner, cache in enumerate(self.caches):
            if cache is not None and cache.num_rows:
                if self._cached_tables is None:
                    self.counters.written_back_rows += cache.num_rows
                    self.counters.written_back_bytes[owner] += cache.flush(nodes, state)
                else:  # split tables: written back at the end of their last span already
                    cache.forget()
        self._cached_tables = None

    # ---- a step: load (plan + owners' reads) and finish (compute + update) ----
    def _load(self, index: int, batches: list[torch.Tensor], context, reads_after) -> StepState:
        full = len(batches) == self.num_devices and all(len(b) == self.batch_size for b in batches)
        if self.graphs is not None and full and self.graphs.ready_for(context):
            step = self.graphs.state_for(index)
        else:
            step = StepState([None] * len(batches))
        step.index = index
        step.clear_events()
        self.counters.steps += 1
        for g, batch in enumerate(batches):
            lanes = self.lanes[g]
            with on(self.lanes[0].load, lanes.load):  # device 0's too: shared draws are copied from there
                wait(lanes.load, reads_after)  # the bound: and static tensors are free again
                self._inputs(step, g, batch, context)
        if self.graphs is not None and self.graphs.replays(step, "load", context):
            return step
        self.run_phase(range(step.active), "load", [], lambda g: self.plan_phase(step, g, context), step.planned)
        self.run_phase(range(self.num_devices if self.dedup else step.active), "load", step.planned + reads_after,
                    lambda d: self.read_phase(step, d, context), step.loaded)
        return step

    def _finish(self, step: StepState, context, on_batch) -> StepState:
        if self.graphs is None or not self.graphs.replays(step, "finish", context):
            self.run_phase(range(step.active), "compute", step.loaded, lambda g: self.compute_phase(step, g, context),
                        step.computed)
            # Relations(i) on device d precede compute(i+1) on d, which relations(i+1) on every device waits
            # for before its compute(i+2) rewrites the gradients read here: no event is needed.
            self.run_phase(range(self.num_devices), "compute", step.computed, lambda d: self.relations_phase(step, d),
                        [])
            self.run_updates(step, lambda d: self.update_phase(step, d, context))
            if self.graphs is not None and step.active == self.num_devices:
                self.graphs.warmed_up = True
        self.counters.count_relations(step.active, self._relation_bytes(step))
        on_batch(step.active)
        return step

    def run_updates(self, step: StepState, run: Callable[[int], None]) -> None:
        """The update phase, ``run(d)`` on every device's update lane once the step's gradients exist: one
        owner per row, so a row's updates are ordered on its owner's stream and owners never wait for each
        other."""
        self.run_phase(range(self.num_devices), "update", step.computed, run, step.updated)

    def read_phase(self, step: StepState, d: int, context) -> None:
        """Device d reads rows from the host: as an owner, the union of the requests (dedup), or its own
        rows (baseline)."""
        (self.read_union_phase if self.dedup else self.read_own_phase)(step, d, context)

    def run_phase(self, devices, lane: str, waits: list, run: Callable[[int], None], events: list) -> None:
        """``run(d)`` on each device's ``lane`` stream once ``waits`` are done; an event per device into
        ``events``."""
        for d in devices:
            stream = getattr(self.lanes[d], lane)
            with on(stream):
                wait(stream, waits)
                run(d)
                events.append(record(stream))

    # ---- the phases (eager here; captured into graphs by PhaseGraphs) ----
    def _inputs(self, step: StepState, g: int, batch: torch.Tensor, context) -> None:
        """A batch and its negative draws on device g (into the static tensors of a graphed step)."""
        device, model, static = self.devices[g], self.steps[g], step.edges[g] is not None
        if static:
            step.edges[g].copy_(batch, non_blocking=True)
            model.negative_draws(len(batch), context.candidates[g], context.sampling[g], out=step.draws[g])
        else:
            step.edges[g] = batch.to(device, non_blocking=True)
            step.draws.append(model.negative_draws(len(batch), context.candidates[g], context.sampling[g]))
        if self.shared_negatives and g > 0:
            self._share_uniform_draws(step, g, static)

    def _share_uniform_draws(self, step: StepState, g: int, static: bool) -> None:
        """The step's first device draws the uniform negatives every device of the step uses."""
        for direction, (uniform, picks) in enumerate(step.draws[g]):
            first = step.draws[0][direction][0]
            if first.shape != uniform.shape:
                return  # a shorter last batch has fewer chunks
            if static:
                uniform.copy_(first, non_blocking=True)
            else:
                step.draws[g][direction] = (first.to(self.devices[g], non_blocking=True), picks)

    def plan_phase(self, step: StepState, g: int, context) -> None:
        model = self.steps[g]
        plan = model.plan_batch(step.edges[g], None, context.candidates[g], defer_count=True, draws=step.draws[g],
                                table_rows=len(context.nodes))
        grouped = group_by_owner(plan.rows, plan.local, plan.unique_count, self.num_devices)
        put(step.plans, g, plan.routed(grouped.rows, grouped.local))
        put(step.grouped, g, grouped)
        self.counters.count_planned(g, grouped.per_owner)

    def read_union_phase(self, step: StepState, owner: int, context) -> None:
        """Owner: the union of the rows every device requests from it, read once (cache or host)."""
        nodes, device = context.nodes, self.devices[owner]
        lengths = [len(step.grouped[g].rows) for g in range(step.active)]
        sentinel = len(nodes)
        requests = torch.full((sum(lengths),), sentinel, dtype=torch.long, device=device)
        start = 0
        for g, length in enumerate(lengths):
            grouped = step.grouped[g]
            move_rows(grouped.rows, requests[start:start + length], grouped.per_owner[owner:owner + 1],
                      source_start=grouped.offsets[owner:owner + 1])
            start += length
        union = union_of_requests(requests, lengths, sentinel)
        cache = self.caches[owner]
        read = gather_rows(nodes, union.rows, torch.empty(len(union.rows), nodes.shape[1], dtype=nodes.dtype,
                                                          device=device), union.count, cache)
        counts = self.counters.on_device[owner]
        counts[UNION_ROWS:UNION_ROWS + 1].add_(union.count)
        if cache is not None:  # counted even while empty: a graph captured then must count later spans' hits
            real = torch.arange(len(union.rows), device=device) < union.count
            hits = (cache.slot_of[union.rows.clamp(max=sentinel - 1)] >= 0) & real
            counts[CACHE_HITS:CACHE_HITS + 1].add_(hits.sum())
        put(step.owners, owner, union)
        put(step.read, owner, read)

    def read_own_phase(self, step: StepState, g: int, context) -> None:
        """Baseline: device g reads all its rows from the host."""
        nodes, grouped = context.nodes, step.grouped[g]
        put(step.inputs, g, gather_rows(nodes, grouped.rows, torch.empty(len(grouped.rows), nodes.shape[1],
                                                                          dtype=nodes.dtype,
                                                                          device=self.devices[g]), grouped.count))

    def compute_phase(self, step: StepState, g: int, context) -> None:
        grouped = step.grouped[g]
        if self.dedup:  # pull each owner's rows over NVLink, in grouped order
            inputs = torch.empty(len(grouped.rows), context.nodes.shape[1], dtype=context.nodes.dtype,
                                 device=self.devices[g])
            for owner in range(self.num_devices):
                move_rows(step.read[owner], inputs, grouped.per_owner[owner:owner + 1],
                          source_rows=step.owners[owner].positions[g], target_start=grouped.offsets[owner:owner + 1])
            put(step.inputs, g, inputs)
        plan = step.plans[g]
        grad, relation_grads, loss = self.steps[g].gradients(plan, step.inputs[g], context.dropout[g])
        self.losses[g].add_(loss * len(plan.edges))
        put(step.grads, g, grad)
        put(step.relation_grads, g, relation_grads)

    def update_phase(self, step: StepState, d: int, context) -> None:
        """Owner d: one update of each of its rows with every device's gradient (dedup); or, device by
        device, the update of the rows it owns in that device's batch (baseline: the same arithmetic)."""
        nodes, state = context.nodes, context.state
        if self.dedup:
            union, device = step.owners[d], self.devices[d]
            # Only the rows a device sent are written and flagged: no fill of [G, padded rows, d].
            stacked = torch.empty(step.active, len(union.rows), nodes.shape[1], dtype=nodes.dtype, device=device)
            present = torch.zeros(step.active, len(union.rows), dtype=torch.bool, device=device)
            for g in range(step.active):
                grouped = step.grouped[g]
                move_rows(step.grads[g], stacked[g], grouped.per_owner[d:d + 1], target_rows=union.positions[g],
                          source_start=grouped.offsets[d:d + 1])
                present[g].index_fill_(0, union.positions[g], True)  # a padded request marks the sentinel's slot
            self.node_update(nodes, state, union.rows, stacked, union.count, cache=self.caches[d], present=present)
        else:  # rows and gradients read from each device where they are (peer access)
            for g in range(step.active):
                grouped = step.grouped[g]
                self.node_update(nodes, state, grouped.rows, step.grads[g], grouped.per_owner[d:d + 1], cache=None,
                                 start=grouped.offsets[d:d + 1])

    def relations_phase(self, step: StepState, d: int, count: bool = True) -> None:
        """All-reduce: replica d sums the devices' relation gradients in device order and takes one step."""
        summed = None
        for h in range(step.active):
            grads = step.relation_grads[h]
            if h != d:  # pulled from device h
                pulled = [torch.empty_like(grad, device=self.devices[d]) for grad in grads]
                for source, target in zip(grads, pulled):
                    move_rows(source.reshape(len(source), -1), target.reshape(len(target), -1), len(source))
                grads = pulled
            summed = list(grads) if summed is None else [a + b for a, b in zip(summed, grads)]
        if count:
            self.steps[d].step_relations([summed])
        else:
            self.steps[d].apply_relation_gradients([summed])

    def _relation_bytes(self, step: StepState) -> int:
        """Bytes of one device's relation gradients in ``step``."""
        if not step.relation_grads or step.relation_grads[0] is None:
            return 0
        return sum(g.numel() * g.element_size() for g in step.relation_grads[0])


@dataclass
class _SpanContext:
    nodes: torch.Tensor
    state: torch.Tensor
    candidates: list
    sampling: list
    dropout: list
