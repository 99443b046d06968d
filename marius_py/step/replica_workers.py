"""Replicated tables with a process per device: the trainer's process drives device 0, workers the others.

The trainer keeps its one process and its runner interface
(``ReplicaProcessesRunner.run``): it starts a worker process for every further
device, each holding a copy of the tables and of the model, and all of them
form a torch.distributed group (NCCL on GPUs, gloo on CPU) whose collectives
move the tables, each span's edges and every step's gradients
(``pipeline.replica_group``). Commands (copy the tables, train a span, stop)
reach the workers over pipes; a worker that fails reports its traceback.
"""

from __future__ import annotations

import contextlib
import functools
import io
import multiprocessing.connection
import os
import tempfile
import traceback
from datetime import timedelta

import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing

from marius_py.config import Config
from marius_py.pipeline.replica_group import GroupStepper, dealt_batches
from marius_py.pipeline.row_kernels import sparse_adagrad_
from marius_py.process_settings import set_deterministic_algorithms
from marius_py.step.fused import gradient_step
from marius_py.step.model import StepModel

GROUP_TIMEOUT = timedelta(minutes=5)  # a collective waits this long for a rank before failing
TRACE = os.environ.get("MARIUS_TRACE_GROUP") == "1"  # each process prints where it is (diagnosing a stall)


def _trace(rank: int, what: str) -> None:
    if TRACE:
        print(f"[marius group {time.strftime('%H:%M:%S')} rank {rank}] {what}", file=sys.stderr, flush=True)


def group_step(model: StepModel, config: Config, device: torch.device) -> GroupStepper:
    """This process's stepper: the fused step's gradients where the model has them (as one process does)."""
    step = gradient_step(model)
    adagrad = model.node_optimizer
    p = config.pipeline
    return GroupStepper(step, functools.partial(sparse_adagrad_, lr=adagrad.lr, eps=adagrad.eps), device,
                        config.training.batch_size, p.staleness_bound or 2, graphs=config.training.cuda_graphs)


class WorkerFailed(RuntimeError):
    """A worker process of the group failed; the message carries its traceback."""


class ReplicaProcessesRunner:
    """The trainer's runner for replicated tables with a process per device (see the module docstring)."""

    def __init__(self, model: StepModel, config: Config, devices: list[torch.device]):
        self.devices, self.model = devices, model
        self.world = len(devices)
        backend = "nccl" if devices[0].type == "cuda" else "gloo"
        if dist.is_initialized():
            raise RuntimeError("a process per device needs its own torch.distributed group: this process has one")
        handle, rendezvous = tempfile.mkstemp(prefix="marius-group-")
        os.close(handle)
        os.unlink(rendezvous)  # (the file store creates it)
        context = multiprocessing.get_context("spawn")
        self.pipes, self.workers = [], []
        for rank in range(1, self.world):
            ours, theirs = context.Pipe()
            worker = context.Process(target=_worker, args=(rank, self.world, backend, rendezvous, config,
                                                            model.num_nodes, model.decoder.num_relations,
                                                            str(devices[rank]), theirs),
                                     daemon=True, name=f"marius-replica-{rank}")
            worker.start()
            self.pipes.append(ours)
            self.workers.append(worker)
        if devices[0].type == "cuda":
            torch.cuda.set_device(devices[0])
        _trace(0, f"started {self.world - 1} workers")
        self._await_joining()
        _trace(0, "workers joining the group")
        with self._reporting_workers():
            dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=0, world_size=self.world,
                                    timeout=GROUP_TIMEOUT)
        _trace(0, "group formed")
        self.stepper = group_step(model, config, devices[0])
        self.tables = None
        self.counters = _GroupCounters(self)
        self.max_in_flight = 0
        self.dedup = self.dedup_trial = None  # (every process holds every row: nothing to deduplicate)
        self.zero_copy = False  # (the tables live in the devices' memory)

    @property
    def effective_staleness(self) -> int:
        return self.stepper.staleness

    @property
    def host_seconds(self) -> float:
        return self.stepper.host_seconds

    def run(self, edges: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor, candidates,
            sampling: list[torch.Generator], dropout: list[torch.Generator], loss_sum: torch.Tensor,
            on_batch) -> None:
        """Train ``edges`` (shuffled) with every process; on return ``nodes`` and ``state`` hold every update."""
        if candidates is not None and not candidates.is_identity:
            raise ValueError("replicated tables train in-memory spans only")
        with self._reporting_workers():
            self._run(edges, nodes, state, sampling, dropout, loss_sum, on_batch)

    def _run(self, edges, nodes, state, sampling, dropout, loss_sum, on_batch) -> None:
        if self.tables is None or self.tables[0] is not nodes or self.tables[1] is not state:
            self._send_all("tables", {"model": _serialized(self.model.state_dict()), "dtype": str(nodes.dtype),
                                      "shape": (tuple(nodes.shape), tuple(state.shape))})
            dist.broadcast(nodes, 0)
            dist.broadcast(state, 0)
            self.tables = (nodes, state)
            _trace(0, "tables sent")
        edges = edges.to(self.devices[0]).contiguous()
        self._send_all("span", {"edges": len(edges), "precision": torch.get_float32_matmul_precision(),
                                "deterministic": torch.are_deterministic_algorithms_enabled(),
                                "sampling": [g.get_state() for g in sampling],
                                "dropout": [g.get_state() for g in dropout]})
        dist.broadcast(edges, 0)
        batches = dealt_batches(edges, self.stepper.batch_size, 0, self.world)
        _trace(0, f"span of {len(batches)} steps")
        self.stepper.run(batches, nodes, state, sampling[0], dropout[0], lambda: on_batch(self.world))
        _trace(0, "span enqueued")
        dist.reduce(self.stepper.loss, 0)
        loss_sum.add_(self.stepper.loss.to(loss_sum.device))
        self.stepper.loss.zero_()
        self._replies()
        self.max_in_flight = max(self.max_in_flight, self.stepper.staleness)
        if self.devices[0].type == "cuda":
            torch.cuda.synchronize(self.devices[0])

    def _await_joining(self) -> None:
        """Wait until every worker has started (imports, its device) and is joining the group; a worker that
        died first is reported with its traceback instead of a rendezvous that waits out its timeout."""
        waiting = dict(enumerate(self.pipes, 1))
        while waiting:
            for rank, pipe in list(waiting.items()):
                if pipe.poll(0.1):
                    status, detail = pipe.recv()
                    if status != "joining":
                        raise WorkerFailed(f"replica worker {rank} failed:\n{detail}")
                    del waiting[rank]
                elif not self.workers[rank - 1].is_alive():
                    raise WorkerFailed(f"replica worker {rank} exited with code {self.workers[rank - 1].exitcode} "
                                       "before joining the group")

    @contextlib.contextmanager
    def _reporting_workers(self):
        """A collective that fails (a rank never came, or timed out) raises with the workers' own reports."""
        try:
            yield
        except Exception as error:
            reports = []
            for rank, (pipe, worker) in enumerate(zip(self.pipes, self.workers), 1):
                if pipe.poll(0):
                    status, detail = pipe.recv()
                    reports.append(f"replica worker {rank}: {status}\n{detail}")
                elif not worker.is_alive():
                    reports.append(f"replica worker {rank} exited with code {worker.exitcode}")
            if not reports:
                raise
            raise WorkerFailed("\n".join(reports)) from error

    def _send_all(self, op: str, payload: dict) -> None:
        for pipe in self.pipes:
            pipe.send((op, payload))

    def _replies(self) -> None:
        for rank, pipe in enumerate(self.pipes, 1):
            status, detail = pipe.recv()
            if status != "done":
                raise WorkerFailed(f"replica worker {rank} failed:\n{detail}")

    def close(self) -> None:
        """Stop the workers and leave the group (the trainer closes it at the end of a run)."""
        if not self.workers:
            return
        for pipe in self.pipes:
            try:
                pipe.send(("stop", {}))
            except OSError:  # (a worker that died closed its end: nothing to stop)
                pass
        for worker in self.workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.terminate()
        self.workers = []
        if dist.is_initialized():
            dist.destroy_process_group()


class _GroupCounters:
    """The epoch record's transfer counts: the bytes the all-gathers moved, from the steps taken; per pair
    of processes, what each receives from each other (a collective may route them through others)."""

    def __init__(self, runner: ReplicaProcessesRunner):
        self.runner, self.base = runner, 0

    def reset(self) -> None:
        self.base = self.runner.stepper.steps

    def snapshot(self, embedding_bytes: int, row_bytes: int) -> dict:
        stepper = self.runner.stepper
        steps = stepper.steps - self.base
        sent = stepper.buffers[0][0].nbytes() if stepper.buffers[0] is not None else 0
        world, idle = stepper.world, [0] * stepper.world
        pairs = [[0 if h == d else steps * sent for d in range(world)] for h in range(world)]
        return {"device_to_device": {"bytes": steps * sent * world * (world - 1)}, "steps": steps,
                "links": {"host_to_device": idle, "device_to_host": idle, "device_to_device": pairs}}


def _serialized(state: dict) -> bytes:
    """A state dict as bytes: tensors sent through a torch.multiprocessing pipe would move into shared memory
    and stay shared (the workers' optimizer state would be the trainer's own tensors)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _worker(rank: int, world: int, backend: str, rendezvous: str, config: Config, num_nodes: int,
            num_relations: int, device_name: str, pipe: multiprocessing.connection.Connection) -> None:
    """A worker's life: join the group, then serve commands until told to stop."""
    device = torch.device(device_name)
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        pipe.send(("joining", None))
        _trace(rank, "joining the group")
        dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                                timeout=GROUP_TIMEOUT)
        torch.manual_seed(config.training.seed)
        model = StepModel(config, num_nodes, num_relations, device)
        stepper = group_step(model, config, device)
        nodes = state = None
        while True:
            op, payload = pipe.recv()
            if op == "stop":
                break
            _trace(rank, op)
            if op == "tables":
                model.load_state_dict(torch.load(io.BytesIO(payload["model"]), map_location=device))
                dtype = getattr(torch, payload["dtype"].removeprefix("torch."))
                nodes = torch.empty(payload["shape"][0], dtype=dtype, device=device)
                state = torch.empty(payload["shape"][1], dtype=dtype, device=device)
                dist.broadcast(nodes, 0)
                dist.broadcast(state, 0)
                continue
            _train_span(stepper, payload, nodes, state, rank, world, device)
            pipe.send(("done", None))
    except BaseException:
        pipe.send(("failed", traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train_span(stepper: GroupStepper, payload: dict, nodes, state, rank: int, world: int,
                device: torch.device) -> None:
    torch.set_float32_matmul_precision(payload["precision"])  # (as the trainer's process trains)
    set_deterministic_algorithms(payload["deterministic"], warn_only=True)
    edges = torch.empty(payload["edges"], 3, dtype=torch.long, device=device)
    dist.broadcast(edges, 0)
    sampling, dropout = (torch.Generator(device) for _ in range(2))
    sampling.set_state(payload["sampling"][rank])
    dropout.set_state(payload["dropout"][rank])
    stepper.run(dealt_batches(edges, stepper.batch_size, rank, world), nodes, state, sampling, dropout)
    dist.reduce(stepper.loss, 0)
    stepper.loss.zero_()
