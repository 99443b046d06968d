"""Several devices, each holding all the node tables: data-parallel steps whose updates stay exact.

Where the tables fit in every GPU's memory, each device keeps a whole replica,
so no step waits for another device's rows. A span's edges are dealt as
``pipeline.multi_device`` deals them (step k gives device g the batch
``k * G + g``), and a step runs three phases on every device:

1. compute: plan the batch on the device, gather its rows from the device's
   own replica and compute the gradients of those rows and of the relations
   (the step's ``gradients``); nothing is written;
2. exchange: each device receives the other devices' packed row ids, row
   counts and gradients, one copy per pair of devices on a stream of that pair
   (copy engines over NVLink: no SMs are taken from compute);
3. apply: each device applies all the devices' gradients to its replica, one
   device after the other (consecutive Adagrad steps in device order: the
   arithmetic of ``MultiDeviceRunner``'s owners), and steps its relation
   replica with their sum in device order.

Every replica applies the same gradients in the same order whatever the
timing, so the replicas stay equal and device 0's tables are the model. The
apply runs on its own stream. With ``staleness_bound`` 2 (the default) step
i+1 computes while step i's gradients cross and are applied, so a batch may
miss (or see in part) the previous step's updates, never older ones. Bound 1
applies each step before the next computes; the model then equals
``MultiDeviceRunner``'s at bound 1 (tests compare them). On CUDA with a
graphable step, each device's compute and apply phases are CUDA graphs over two
alternating sets of static tensors, so the host enqueues a few launches per
device and step. On a CPU the same code runs inline, so G simulated devices
test it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import time

import torch

from marius_py.pipeline.lanes import enable_peer_access, on, record, wait
from marius_py.pipeline.phase_graphs import GRAPH_STALENESS, PhaseGraphs
from marius_py.pipeline.row_kernels import gather_rows
from marius_py.pipeline.step import BatchStep


def apply_in_order(step: BatchStep, node_update: Callable, received: list["Gradients"], nodes: torch.Tensor,
                   state: torch.Tensor, count: bool = True) -> None:
    """One replica takes every device's gradients: the rows' as consecutive updates in device order, the
    relations' summed in device order and stepped once (``count`` False: without the host-side step count,
    as a CUDA graph captures it)."""
    summed = None
    for sent in received:
        node_update(nodes, state, sent.rows, sent.grads, sent.count)
        summed = list(sent.relation_grads) if summed is None else [a + b for a, b in zip(summed, sent.relation_grads)]
    if count:
        step.step_relations([summed])
    else:
        step.apply_relation_gradients([summed])


_ALIGN = 16  # bytes: every packed tensor starts aligned for its dtype and for vector loads


@dataclass
class Gradients:
    """What one device's batch sends every replica, packed into one byte buffer (one copy, or one collective,
    moves it): its unique rows (the first ``count`` real), their gradients and the relation gradients."""

    buffer: torch.Tensor                 # uint8: the tensors below are views of it
    rows: torch.Tensor                   # [capacity] int64
    count: torch.Tensor                  # [1] int64
    grads: torch.Tensor                  # [capacity, d]
    relation_grads: list[torch.Tensor]

    @classmethod
    def empty(cls, capacity: int, grads_like: torch.Tensor, relation_like: list[torch.Tensor],
              device: torch.device) -> "Gradients":
        """Room for ``capacity`` rows of gradients like ``grads_like``'s and relation gradients like these."""
        spec = [(torch.long, (capacity,)), (torch.long, (1,)), (grads_like.dtype, (capacity, grads_like.shape[1])),
                *[(t.dtype, tuple(t.shape)) for t in relation_like]]
        return cls.viewing(torch.empty(_packed_bytes(spec), dtype=torch.uint8, device=device), spec)

    @classmethod
    def pack(cls, rows: torch.Tensor, count: torch.Tensor | None, grads: torch.Tensor,
             relation_grads: list[torch.Tensor]) -> "Gradients":
        return cls.empty(len(rows), grads, relation_grads, rows.device).fill_(rows, count, grads, relation_grads)

    def fill_(self, rows: torch.Tensor, count: torch.Tensor | None, grads: torch.Tensor,
              relation_grads: list[torch.Tensor]) -> "Gradients":
        """Copy a batch's gradients in (its rows may be fewer than the capacity: ``count`` says how many)."""
        self.rows[:len(rows)].copy_(rows)
        self.grads[:len(rows)].copy_(grads)
        if count is None:
            self.count.fill_(len(rows))
        else:
            self.count.copy_(count.reshape(1))
        for target, grad in zip(self.relation_grads, relation_grads):
            target.copy_(grad)
        return self

    def tensors(self) -> list[torch.Tensor]:
        return [self.rows, self.count, self.grads, *self.relation_grads]

    def spec(self) -> list[tuple[torch.dtype, tuple[int, ...]]]:
        return [(t.dtype, tuple(t.shape)) for t in self.tensors()]

    def empty_like(self, device: torch.device) -> "Gradients":
        return self.viewing(torch.empty_like(self.buffer, device=device), self.spec())

    def copy_(self, source: "Gradients") -> "Gradients":
        self.buffer.copy_(source.buffer, non_blocking=True)
        return self

    def nbytes(self) -> int:
        return self.buffer.numel()

    @classmethod
    def viewing(cls, buffer: torch.Tensor, spec: list[tuple[torch.dtype, tuple[int, ...]]]) -> "Gradients":
        """The tensors of ``spec`` laid out in ``buffer`` (uint8, ``_packed_bytes(spec)`` long)."""
        views, offset = [], 0
        for dtype, shape in spec:
            size = _nbytes(dtype, shape)
            views.append(buffer[offset:offset + size].view(dtype).view(shape))
            offset += -(-size // _ALIGN) * _ALIGN
        return cls(buffer, views[0], views[1], views[2], views[3:])


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()


def _packed_bytes(spec: list[tuple[torch.dtype, tuple[int, ...]]]) -> int:
    return sum(-(-_nbytes(dtype, shape) // _ALIGN) * _ALIGN for dtype, shape in spec)


@dataclass
class _Step:
    index: int
    sent: list[Gradients] = field(default_factory=list)               # per active device
    received: list[list[Gradients]] = field(default_factory=list)     # [device][sender]
    computed: list = field(default_factory=list)                      # events, per device
    exchanged: list = field(default_factory=list)
    applied: list = field(default_factory=list)
    full: bool = False      # G batches of the batch size
    graphed: bool = False

    @property
    def active(self) -> int:
        return len(self.sent)


class ExchangeCounters:
    """Bytes the devices' gradient copies moved in an epoch, per pair of devices (host arithmetic: no device
    reads). Counted as GPUs copy them: simulated devices share memory and copy nothing. The tables stay on
    the devices: no host link carries rows (the edges, 24 bytes each, are not counted)."""

    def __init__(self, num_devices: int):
        self.num_devices = num_devices
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.pairs = [[0] * self.num_devices for _ in range(self.num_devices)]  # [sender][receiver]

    def count_sent(self, sender: int, receiver: int, nbytes: int) -> None:
        self.pairs[sender][receiver] += nbytes

    def snapshot(self, embedding_bytes: int, row_bytes: int) -> dict:
        idle = [0] * self.num_devices
        return {"device_to_device": {"bytes": sum(map(sum, self.pairs))}, "steps": self.steps,
                "links": {"host_to_device": idle, "device_to_host": idle,
                          "device_to_device": [row.copy() for row in self.pairs]}}


class ReplicatedRunner:
    """Trains in-memory spans on ``devices``, each with a replica of the tables (see the module docstring)."""

    def __init__(self, steps: list[BatchStep], node_update: Callable, devices: list[torch.device], batch_size: int,
                 staleness_bound: int, graphs: bool = False):
        """``steps[g]``: device g's step (its own relation replica). ``node_update(nodes, state, rows, grads,
        count)``: the in-place optimizer update of rows (``row_kernels.sparse_adagrad_``). ``graphs``: replay
        full steps as CUDA graphs where ``ReplicaGraphs.supported``."""
        if len(steps) != len(devices) or not devices:
            raise ValueError("a replicated runner needs one step per device")
        self.steps, self.node_update, self.devices = steps, node_update, devices
        self.batch_size, self.staleness_bound = batch_size, max(1, staleness_bound)
        cuda = devices[0].type == "cuda"
        self.compute_streams = [torch.cuda.Stream(d) if cuda else None for d in devices]
        self.copy_streams = [torch.cuda.Stream(d) if cuda else None for d in devices]
        self.update_streams = [torch.cuda.Stream(d) if cuda else None for d in devices]
        # [sender][receiver]: the stream of each copy between two GPUs
        self.pair_streams = [[torch.cuda.Stream(sender) if cuda and h != d else None for d in range(len(devices))]
                             for h, sender in enumerate(devices)]
        enable_peer_access(devices)
        self.losses = [torch.zeros((), device=d) for d in devices]
        self.tables: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per device; [0]: the caller's
        self.counters = ExchangeCounters(len(devices))
        self.graphs = ReplicaGraphs(self) if graphs and ReplicaGraphs.supported(self) else None
        self.max_in_flight = 0
        self.host_seconds = 0.0  # spent enqueuing steps (a host-bound run spends all its time here)
        self.dedup = self.dedup_trial = None  # (every device holds every row: nothing to deduplicate)
        self.zero_copy = False  # (the tables live in the devices' memory)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def effective_staleness(self) -> int:
        return min(self.staleness_bound, GRAPH_STALENESS)

    def close(self) -> None:
        """Nothing to release: the replicas and streams go with the runner."""

    def replicate(self, nodes: torch.Tensor, state: torch.Tensor) -> None:
        """Copy the tables to every further device, unless they hold these tables already (the caller's
        tables change only through ``run``; new tables, such as a restored version's, are copied again)."""
        if self.tables is not None and self.tables[0][0] is nodes and self.tables[0][1] is state:
            return
        if nodes.device != self.devices[0]:
            raise ValueError(f"replicated tables start on {self.devices[0]}, not {nodes.device}")
        self.tables = [(nodes, state)] + [(nodes.to(d, copy=True), state.to(d, copy=True))
                                          for d in self.devices[1:]]

    # ---- a span ----
    def run(self, edges: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor, candidates,
            sampling: list[torch.Generator], dropout: list[torch.Generator], loss_sum: torch.Tensor,
            on_batch: Callable[[int], None]) -> None:
        """Train ``edges`` (already shuffled) in steps of G batches; on return every replica, ``nodes`` and
        ``state`` included, holds every update."""
        if candidates is not None and not candidates.is_identity:
            raise ValueError("replicated tables train in-memory spans only")
        self.replicate(nodes, state)
        steps = self._deal(edges)
        lanes = list(zip(self.compute_streams, self.copy_streams, self.update_streams))
        for device, streams in zip(self.devices, lanes):
            for stream in streams:  # after what the caller queued (relations restored, the loss zeroed)
                if stream is not None:
                    stream.wait_stream(torch.cuda.current_stream(device))
        bound = self.effective_staleness
        pending: deque[_Step] = deque()
        applied: deque[_Step] = deque()
        started = time.perf_counter()
        for index, batches in enumerate(steps):
            step = self._compute(index, batches, sampling, dropout, applied)
            self._exchange(step, applied)
            pending.append(step)
            self.max_in_flight = max(self.max_in_flight, len(pending))
            if len(pending) >= bound:
                self._retire(self._apply(pending.popleft()), applied)
            on_batch(len(batches))
        while pending:
            self._retire(self._apply(pending.popleft()), applied)
        self.host_seconds += time.perf_counter() - started
        for device, streams in zip(self.devices, lanes):
            for stream in streams:
                if stream is not None:
                    torch.cuda.current_stream(device).wait_stream(stream)
        for loss in self.losses:
            loss_sum.add_(loss.to(loss_sum.device))
            loss.zero_()
        for device in self.devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

    def _deal(self, edges: torch.Tensor) -> list[list[torch.Tensor]]:
        """The span's steps, each a list of batches (device g's on device g): the full steps' batches are moved
        to their devices in one copy per device, so no step waits for a copy out of device 0."""
        size, count = self.batch_size, self.num_devices
        full = len(edges) // (size * count)
        dealt = edges[:full * size * count].reshape(full, count, size, edges.shape[1])
        local = [dealt[:, g].to(device, non_blocking=True) for g, device in enumerate(self.devices)]
        steps = [[local[g][k] for g in range(count)] for k in range(full)]
        tail = edges[full * size * count:]
        if len(tail):
            steps.append([tail[s:s + size] for s in range(0, len(tail), size)])
        return steps

    def _retire(self, step: _Step, applied: deque) -> None:
        """Keep the last two applied steps: a step's exchange may reuse what the step two before used."""
        applied.append(step)
        while len(applied) > 2:
            old = applied.popleft()
            if not old.graphed:  # fresh tensors: free them only once every device is done with them
                for event in old.applied:
                    if event is not None:
                        event.synchronize()

    def _earlier(self, applied: deque, index: int) -> _Step | None:
        """The applied step ``index``, if still kept (the one whose static tensors step index + 2 reuses)."""
        return next((s for s in applied if s.index == index), None)

    # ---- the phases ----
    def _compute(self, index: int, batches: list[torch.Tensor], sampling, dropout, applied: deque) -> _Step:
        graphs = self.graphs
        full = len(batches) == self.num_devices and all(len(b) == self.batch_size for b in batches)
        step = _Step(index, full=full, graphed=graphs is not None and full and graphs.ready())
        reused = self._earlier(applied, index - 2)  # its copies read the static tensors this step rewrites
        missed = self._earlier(applied, index - self.effective_staleness)  # the last step this one must see
        for g, batch in enumerate(batches):
            stream = self.compute_streams[g]
            with on(stream):
                if reused is not None:
                    wait(stream, [event for d, event in enumerate(reused.exchanged) if d != g])
                if missed is not None:
                    wait(stream, missed.applied[g:g + 1])
                if step.graphed:
                    step.sent.append(graphs.compute(index, g, batch, sampling[g]))
                else:
                    model = self.steps[g]
                    edges = batch.to(self.devices[g], non_blocking=True)
                    draws = model.negative_draws(len(edges), None, sampling[g])
                    step.sent.append(self.gradients_on(g, edges, draws, dropout[g]))
                step.computed.append(record(stream))
        return step

    def gradients_on(self, g: int, edges: torch.Tensor, draws, dropout: torch.Generator | None) -> Gradients:
        """Device g's batch: its plan, rows gathered from its replica, gradients (captured by graphs too)."""
        model, (nodes, _) = self.steps[g], self.tables[g]
        plan = model.plan_batch(edges, None, None, defer_count=True, draws=draws, table_rows=len(nodes))
        rows = gather_rows(nodes, plan.rows, torch.empty(len(plan.rows), nodes.shape[1], dtype=nodes.dtype,
                                                         device=nodes.device), plan.unique_count)
        grads, relation_grads, loss = model.gradients(plan, rows, dropout)
        self.losses[g].add_(loss * len(plan.edges))
        return Gradients.pack(plan.rows, plan.unique_count, grads, list(relation_grads))

    def _exchange(self, step: _Step, applied: deque) -> None:
        """Every device copies the others' gradients; the copy h -> d runs on a stream of its own (torch runs a
        copy between GPUs on the source's current stream), so a sender's copies to its peers overlap."""
        reused = self._earlier(applied, step.index - 2)  # its applies read the buffers this step rewrites
        for d, device in enumerate(self.devices):
            stream = self.copy_streams[d]
            with on(stream):
                if reused is not None:
                    wait(stream, reused.applied[d:d + 1])
                received = []
                for h, sent in enumerate(step.sent):
                    if h != d:
                        self.counters.count_sent(h, d, sent.nbytes())
                    if h == d or device.type != "cuda":  # (simulated devices share memory)
                        received.append(sent if not step.graphed or h == d else
                                        self.graphs.received(step.index, d, h).copy_(sent))
                        continue
                    with on(self.pair_streams[h][d]):
                        wait(self.pair_streams[h][d], [step.computed[h]])
                        target = self.graphs.received(step.index, d, h) if step.graphed else sent.empty_like(device)
                        received.append(target.copy_(sent))
                step.received.append(received)
                step.exchanged.append(record(stream))
        self.counters.steps += 1

    def _apply(self, step: _Step) -> _Step:
        for d in range(self.num_devices):
            stream = self.update_streams[d]
            with on(stream):
                wait(stream, [step.exchanged[d], *step.computed[d:d + 1]])
                if step.graphed:
                    self.graphs.apply(step.index, d)
                else:
                    self.apply_on(d, step.received[d])
                step.applied.append(record(stream))
        if step.graphed:
            for model in self.steps:
                model.count_relation_step()
        elif step.full and self.graphs is not None:
            self.graphs.warmed_up = True
        return step

    def apply_on(self, d: int, received: list[Gradients], count: bool = True) -> None:
        """Replica d takes every device's gradients, in device order (captured by graphs with ``count``
        False: the relation step's host-side count is kept out of the graph)."""
        apply_in_order(self.steps[d], self.node_update, received, *self.tables[d], count)


class ReplicaGraphs:
    """Each device's compute and apply phases of full steps as CUDA graphs, over two alternating sets of
    static tensors (inputs, sent gradients, received copies). Captured once a full eager step has run
    (kernels compiled, library handles made); again when the tables or relation tensors change. On a CPU
    the "graphs" run their phase again (``PhaseGraphs.graph_of``), so tests exercise the static tensors."""

    def __init__(self, runner: ReplicatedRunner):
        self.runner = runner
        self.sets: list[dict | None] = [None, None]
        self.key = None
        self.warmed_up = False

    @staticmethod
    def supported(runner: ReplicatedRunner) -> bool:
        return PhaseGraphs.supported(runner)

    def ready(self) -> bool:
        """Whether a full step may replay graphs: once a full eager step has been applied (capturing cannot
        compile kernels); graphs captured for other tables or relation tensors are dropped."""
        runner = self.runner
        key = (*[t.data_ptr() for pair in runner.tables for t in pair],
               *[t.data_ptr() for step in runner.steps for t in step.relation_tensors()])
        if key != self.key:
            self.key, self.sets = key, [None, None]
        return self.warmed_up

    def compute(self, index: int, g: int, batch: torch.Tensor, sampling: torch.Generator) -> Gradients:
        graphs = self._set(index % 2)
        graphs["edges"][g].copy_(batch, non_blocking=True)
        self.runner.steps[g].negative_draws(len(batch), None, sampling, out=graphs["draws"][g])
        graphs["compute"][g].replay()
        return graphs["sent"][g]

    def received(self, index: int, d: int, h: int) -> Gradients:
        return self._set(index % 2)["received"][d][h]

    def apply(self, index: int, d: int) -> None:
        self._set(index % 2)["apply"][d].replay()

    def _set(self, parity: int) -> dict:
        if self.sets[parity] is None:
            self.sets[parity] = self._capture()
        return self.sets[parity]

    def _capture(self) -> dict:
        runner = self.runner
        size, devices = runner.batch_size, runner.devices
        throwaway = [torch.Generator(d).manual_seed(0) for d in devices]  # shapes only
        edges = [torch.zeros(size, 3, dtype=torch.long, device=d) for d in devices]
        draws = [step.negative_draws(size, None, generator) for step, generator in zip(runner.steps, throwaway)]
        sent: list[Gradients | None] = [None] * len(devices)

        def compute(g: int) -> None:
            sent[g] = runner.gradients_on(g, edges[g], draws[g], None)
        graphs = {"edges": edges, "draws": draws,
                  "compute": [PhaseGraphs.graph_of(compute, g, d, 0) for g, d in enumerate(devices)]}
        if devices[0].type != "cuda":  # CPU: run once for the shapes of what is sent (its loss not counted)
            losses = [loss.clone() for loss in runner.losses]
            for g in range(len(devices)):
                graphs["compute"][g].replay()
                runner.losses[g].copy_(losses[g])
        received = [[sent[h] if h == d else sent[h].empty_like(device) for h in range(len(devices))]
                    for d, device in enumerate(devices)]

        def apply(d: int) -> None:  # its own gradients where its compute left them
            runner.apply_on(d, [sent[h] if h == d else received[d][h] for h in range(len(devices))], count=False)
        graphs.update(sent=sent, received=received,
                      apply=[PhaseGraphs.graph_of(apply, d, device, 0) for d, device in enumerate(devices)])
        return graphs
