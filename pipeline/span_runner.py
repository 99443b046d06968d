"""A span's batches (one buffer state, or a whole in-memory epoch) through the training pipeline.

The three steps the pipeline joins (``pipeline.placements`` adds the transfers):
load (negatives and the touched rows, then their embeddings and optimizer
state gathered where the tables live), compute (the step's ``compute`` on the
compute device) and update (the additive deltas index-added into the tables).
What a batch computes arrives from ``marius_py`` as objects (``pipeline.step``):
the model's plan and compute, and optionally its fused and CUDA-graphed steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from marius_py.pipeline.placements import (PLACEMENT_DEVICE, PLACEMENT_HOST, build_pipeline, default_staleness,
                                 run_planned_ahead)
from marius_py.pipeline.row_kernels import gather_rows
from marius_py.pipeline.step import (BatchStep, FusedBatchStep, GraphedBatchStep, PipelineSettings, add_rows_, rounding_seed,
                           widened)


@dataclass
class BatchInFlight:
    """A batch between stages; the host placement moves it with ``inputs_to``/``outputs_to_host``."""

    plan: object                   # the step's plan (marius_py.step.model.DrawnBatch; rows index the tables)
    table_rows: torch.Tensor       # plan.rows where the tables live (the update's index)
    embeddings: torch.Tensor       # the rows' embeddings and optimizer state
    state: torch.Tensor
    delta: torch.Tensor | None = None
    squared: torch.Tensor | None = None
    seed: torch.Tensor | None = None  # stochastic rounding of the update into bfloat16 tables

    def inputs_to(self, device: torch.device) -> list[torch.Tensor]:
        self.plan = self.plan.to(device, non_blocking=True)
        self.embeddings = self.embeddings.to(device, non_blocking=True)
        self.state = self.state.to(device, non_blocking=True)
        return [*self.plan.tensors(), self.embeddings, self.state]

    def outputs(self) -> list[torch.Tensor]:
        return [self.delta, self.squared]

    def outputs_to_host(self) -> None:
        self.delta, self.squared = (_pinned_copy(t) for t in (self.delta, self.squared))


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _gather(table: torch.Tensor, rows: torch.Tensor, pin: bool) -> torch.Tensor:
    if not pin:
        return table[rows]
    out = torch.empty((len(rows), table.shape[1]), dtype=table.dtype, pin_memory=True)
    return torch.index_select(table, 0, rows, out=out)


class SpanRunner:
    """Runs batches of a span through the placement's pipeline; the loss sum stays on the device."""

    def __init__(self, model: BatchStep, placement: str, settings: PipelineSettings, device: torch.device,
                 batch_size: int, fused_step: FusedBatchStep | None = None,
                 graphed_step: GraphedBatchStep | None = None):
        """``fused_step`` updates the tables in place: in GPU memory (training is synchronous there), or in
        pinned host memory through GPU kernels (``_run_gathered``: updates are read-modify-writes in order);
        ``graphed_step`` replays it as a CUDA graph (device placement)."""
        self.model = model
        self.placement = placement
        self.settings = settings
        self.device = device
        self.batch_size = batch_size
        self.staleness_bound = default_staleness(placement, settings.staleness_bound)
        self.max_in_flight = 0
        self.fused_step = fused_step
        self.graphed_step = graphed_step
        # (runner.Runner's members of several devices: one device has no transfers, dedup or host timing)
        self.counters = self.host_seconds = self.dedup = self.dedup_trial = None

    @property
    def zero_copy(self) -> bool:
        """Whether host tables are trained in place by GPU kernels (``_run_gathered``; the tables must be pinned)."""
        return self.fused_step is not None and self.placement == PLACEMENT_HOST

    @property
    def effective_staleness(self) -> int:
        """The bound on missed updates: 1 in GPU memory, where the bound only sets how far planning runs ahead."""
        return 1 if self.placement == PLACEMENT_DEVICE else self.staleness_bound

    def close(self) -> None:
        """Nothing to release: the pipeline's threads end with each span."""

    def run(self, edges: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor,
            candidates, sampling: torch.Generator, dropout: torch.Generator,
            loss_sum: torch.Tensor, on_batch: Callable[[int], None]) -> None:
        """Train ``edges`` (already shuffled) in batches; add each batch's loss x size to ``loss_sum``."""
        pin = self.placement == PLACEMENT_HOST  # host-to-device copies from pinned memory are asynchronous
        model = self.model
        # bfloat16 tables in GPU memory take the same gathered step as zero copy: rows gathered into float32
        # (neither the in-place step's kernels nor its CUDA graph read bfloat16 tables)
        bfloat16_on_gpu = self.fused_step is not None and nodes.is_cuda and nodes.dtype != torch.float32
        gathered = (self.zero_copy and nodes.is_pinned() and state.is_pinned()) or bfloat16_on_gpu
        if not gathered:
            edges = edges.to(sampling.device)  # once per span (the gathered step moves each batch on its load stream)
        batches = (edges[start:start + self.batch_size] for start in range(0, len(edges), self.batch_size))

        def load(batch: torch.Tensor) -> BatchInFlight:
            plan = model.plan_batch(batch, sampling, candidates)
            if pin:
                plan = plan.pinned()
            return BatchInFlight(plan, plan.rows, _gather(nodes, plan.rows, pin), _gather(state, plan.rows, pin))

        def compute(item: BatchInFlight) -> BatchInFlight:
            update = model.compute(item.plan, widened(item.embeddings), widened(item.state), dropout)
            loss_sum.add_(update.loss * len(item.plan.edges))
            item.delta, item.squared = update.delta, update.squared
            item.seed = rounding_seed(nodes, dropout)  # (here, in batch order: the update stage may lag)
            item.plan = item.embeddings = item.state = None  # free device memory early
            return item

        def update(item: BatchInFlight) -> None:
            add_rows_(nodes, state, item.table_rows, item.delta, item.squared, seed=item.seed)

        if gathered:
            self._run_gathered(edges, nodes, state, candidates, sampling, dropout, loss_sum, on_batch)
        elif self.fused_step is not None and self.placement == PLACEMENT_DEVICE:
            graphed = self.graphed_step
            for batch in batches:  # nothing in the step waits for the device: no need to plan ahead
                if graphed is None or not graphed.run(batch, nodes, state, candidates, sampling):
                    plan = model.plan_batch(batch, sampling, candidates, defer_count=True, table_rows=len(nodes))
                    self.fused_step.run(plan.to(self.device, non_blocking=True), nodes, state, loss_sum, dropout)
                on_batch(1)
            if graphed is not None:
                graphed.add_loss_to(loss_sum)
            self.max_in_flight = max(self.max_in_flight, 1)
        elif self.placement == PLACEMENT_DEVICE:
            run_planned_ahead(batches, lambda batch: self._plan_ahead(batch, sampling, candidates, on_batch),
                              lambda planned: update(compute(self._gather_planned(planned, nodes, state))),
                              self.staleness_bound)
            self.max_in_flight = max(self.max_in_flight, 1)
        else:
            pipeline = build_pipeline(self.placement, load, compute, update, self.staleness_bound, self.device,
                                      self.settings.load_threads, self.settings.queue_size)
            with pipeline:
                for batch in batches:
                    pipeline.submit(batch)
                    on_batch(1)
                pipeline.drain()
            self.max_in_flight = max(self.max_in_flight, pipeline.max_in_flight)
        if self.device.type == "cuda" and self.placement == PLACEMENT_HOST:
            torch.cuda.synchronize(self.device)  # relation parameters were updated on another stream

    def _run_gathered(self, edges, nodes, state, candidates, sampling, dropout, loss_sum, on_batch) -> None:
        """The fused step on each batch's rows gathered into float32, updates written in place by GPU kernels.

        Zero copy: host tables (pinned) read and written over PCIe; no host work per row.
        bfloat16 tables in GPU memory run here too (the in-place step reads float32 only), with
        load and compute on one stream: synchronous, as in-place training in GPU memory is.

        The five stages become two CUDA streams: load (plan on the GPU from
        the host generator's draws; the rows' embeddings gathered from the host
        table over PCIe, the host-to-device stage) and compute (the fused step,
        whose Adagrad kernel reads, updates and writes back the host rows: the
        device-to-host and update stages). A batch's load may run while up to
        bound - 1 earlier batches still compute, so it may read rows they have
        not updated yet; updates are read-modify-writes of the current host
        rows, in batch order, so none is lost.
        """
        device, model = self.device, self.model
        load, compute = self._gathered_streams()
        if nodes.is_cuda:  # bfloat16 tables in GPU memory: one stream, so that each gather follows every earlier
            load = compute  # update, as training in GPU memory is synchronous whatever the bound
        for stream in (load, compute):  # after what the caller queued (the zeroed loss, earlier spans)
            stream.wait_stream(torch.cuda.current_stream(device))
        if candidates is not None:
            candidates = candidates.to(device)  # searched on the GPU without a copy per batch
        in_flight: deque[torch.cuda.Event] = deque()
        for start in range(0, len(edges), self.batch_size):
            if len(in_flight) >= self.staleness_bound:
                in_flight.popleft().synchronize()  # admit a batch only while fewer than the bound are in flight
            with torch.cuda.stream(load):
                batch = edges[start:start + self.batch_size]
                if not batch.is_cuda:  # a span's edges may not fit on the GPU: one batch at a time
                    batch = batch.pin_memory().to(device, non_blocking=True)
                draws = [tuple(None if d is None else d.to(device, non_blocking=True) for d in direction)
                         for direction in model.negative_draws(len(batch), candidates, sampling)]
                plan = model.plan_batch(batch, None, candidates, defer_count=True, draws=draws,
                                        table_rows=len(nodes))
                gathered = torch.empty(len(plan.rows), nodes.shape[1], device=device)
                gather_rows(nodes, plan.rows, gathered, plan.unique_count)
            compute.wait_stream(load)
            with torch.cuda.stream(compute):
                self.fused_step.apply(plan, nodes, state, loss_sum, gathered, generator=dropout)
                done = torch.cuda.Event()
                done.record()
            for tensor in (*plan.tensors(), gathered):
                tensor.record_stream(compute)  # allocated on the load stream, used on compute
            self.fused_step.count_relation_step()
            in_flight.append(done)
            self.max_in_flight = max(self.max_in_flight, len(in_flight))
            on_batch(1)
        torch.cuda.current_stream(device).wait_stream(compute)

    def _gathered_streams(self) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        if not hasattr(self, "_streams"):
            self._streams = torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)
        return self._streams

    def _plan_ahead(self, batch, sampling, candidates, on_batch):
        """A batch's plan on the device, and its unique-row count on its way to the host."""
        plan = self.model.plan_batch(batch, sampling, candidates, defer_count=True)
        plan = plan.to(self.device, non_blocking=True)  # a no-op unless negatives were drawn on the host
        count = torch.empty(1, dtype=plan.unique_count.dtype, pin_memory=True)
        count.copy_(plan.unique_count, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        on_batch(1)
        return plan, count, copied

    @staticmethod
    def _gather_planned(planned, nodes: torch.Tensor, state: torch.Tensor) -> BatchInFlight:
        plan, count, copied = planned
        copied.synchronize()  # planned batches ago: normally long done
        plan = plan.trimmed(int(count))
        return BatchInFlight(plan, plan.rows, nodes[plan.rows], state[plan.rows])
