"""Replicated tables with one process per device: this process's share, gradients gathered by a collective.

``pipeline.replicated`` drives every device from one process, and at four GPUs
that one Python thread is the bound (it spends most of a step enqueuing). Here
each process (a rank of a torch.distributed group: NCCL between GPUs, gloo on
CPU) drives one device with its own copy of the tables. A span's steps are
dealt as there (step k gives rank r the batch ``k * W + r``), and a step runs:

1. compute (compute stream): plan the batch, gather its rows from this copy,
   compute the gradients, and pack them into a fixed-size buffer (a rank with
   no batch in the span's last step sends a count of zero);
2. exchange (comm stream): one all-gather of the W buffers;
3. apply (update stream): every rank's gradients in rank order, as
   consecutive Adagrad steps, and the relations stepped with their sum.

Every copy applies the same gradients in the same order, so the copies stay
equal: the arithmetic and staleness are ``ReplicatedRunner``'s (tests compare
them). Full steps replay CUDA graphs of the compute and apply phases over two
alternating sets of buffers; the collective runs between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from marius_py.pipeline.lanes import on, record, wait
from marius_py.pipeline.phase_graphs import GRAPH_STALENESS, PhaseGraphs
from marius_py.pipeline.replicated import Gradients, apply_in_order
from marius_py.pipeline.row_kernels import gather_rows, triton_available
from marius_py.pipeline.step import BatchStep


def all_gather(output: torch.Tensor, tensor: torch.Tensor):
    """``output`` = every rank's ``tensor``, in rank order (asynchronous; torch 2.3 names it otherwise)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, async_op=True)


def dealt_batches(edges: torch.Tensor, batch_size: int, rank: int, world: int) -> list[torch.Tensor | None]:
    """Rank ``rank``'s batch of every step of a span (None where the span's last step has none for it)."""
    step_edges = batch_size * world
    full = len(edges) // step_edges
    mine = edges[:full * step_edges].reshape(full, world, batch_size, edges.shape[1])[:, rank]
    batches: list[torch.Tensor | None] = list(mine)
    tail = edges[full * step_edges:]
    if len(tail):
        start = rank * batch_size
        batches.append(tail[start:start + batch_size] if start < len(tail) else None)
    return batches


class GroupStepper:
    """This rank's steps over a span (see the module docstring)."""

    def __init__(self, step: BatchStep, node_update: Callable, device: torch.device, batch_size: int,
                 staleness_bound: int, graphs: bool = False):
        self.step, self.node_update, self.device, self.batch_size = step, node_update, device, batch_size
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.staleness = min(max(1, staleness_bound), GRAPH_STALENESS)
        cuda = device.type == "cuda"
        self.compute, self.comm, self.update = (torch.cuda.Stream(device) if cuda else None for _ in range(3))
        self.loss = torch.zeros((), device=device)
        self.buffers: list[tuple[Gradients, torch.Tensor, list[Gradients]] | None] = [None, None]
        self.graphs: list[dict | None] = [None, None]
        self.use_graphs = graphs and cuda and triton_available() and getattr(step, "graphable", False)
        self.graph_key = None
        self.warmed_up = False
        self.steps = 0
        self.host_seconds = 0.0

    def run(self, batches: list[torch.Tensor | None], nodes: torch.Tensor, state: torch.Tensor,
            sampling: torch.Generator, dropout: torch.Generator | None,
            on_step: Callable[[], None] = lambda: None) -> None:
        """Train this rank's ``batches`` (``dealt_batches``) into ``nodes`` and ``state``, in lockstep with
        the other ranks; on return every update of the span is in the tables."""
        started = time.perf_counter()
        streams = [s for s in (self.compute, self.comm, self.update) if s is not None]
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        self._check_graphs(nodes, state)
        events: dict[int, dict] = {}
        for index, batch in enumerate(batches):
            events[index] = self._compute_and_gather(index, batch, nodes, state, sampling, dropout, events)
            if index - self.staleness + 1 >= 0:
                self._apply(index - self.staleness + 1, nodes, state, events)
            events.pop(index - 3, None)
            on_step()
        for index in range(max(0, len(batches) - self.staleness + 1), len(batches)):
            self._apply(index, nodes, state, events)
        for stream in streams:
            torch.cuda.current_stream(self.device).wait_stream(stream)
        self.host_seconds += time.perf_counter() - started

    # ---- a step ----
    def _compute_and_gather(self, index: int, batch, nodes, state, sampling, dropout, events: dict) -> dict:
        full = batch is not None and len(batch) == self.batch_size
        graphed = self.use_graphs and full and self.warmed_up
        sent, gathered, received = self._buffers(index % 2, nodes, state)
        done: dict = {"graphed": graphed, "full": full}
        missed = events.get(index - self.staleness)
        with on(self.compute):
            if missed is not None:  # the updates this step must see (and the buffers it rewrites are free)
                wait(self.compute, [missed["applied"]])
            if graphed:
                graphs = self._graphs(index % 2, nodes, state)
                graphs["edges"].copy_(batch, non_blocking=True)
                self.step.negative_draws(len(batch), None, sampling, out=graphs["draws"])
                graphs["compute"].replay()
            elif batch is None:  # nothing to train: a count of zero, and zero relation gradients
                sent.count.zero_()
                for grad in sent.relation_grads:
                    grad.zero_()
            else:
                edges = batch.to(self.device, non_blocking=True)
                draws = self.step.negative_draws(len(edges), None, sampling)
                self._gradients_into(sent, edges, draws, nodes, dropout)
            computed = record(self.compute)
        earlier = events.get(index - 2)
        with on(self.comm):
            wait(self.comm, [computed] + ([earlier["applied"]] if earlier is not None else []))
            done["work"] = all_gather(gathered, sent.buffer)
        done["received"] = received
        self.steps += 1
        return done

    def _gradients_into(self, sent: Gradients, edges, draws, nodes, dropout) -> None:
        """A batch's gradients packed into ``sent`` (captured by the compute graph too)."""
        plan = self.step.plan_batch(edges, None, None, defer_count=True, draws=draws, table_rows=len(nodes))
        rows = gather_rows(nodes, plan.rows, torch.empty(len(plan.rows), nodes.shape[1], dtype=nodes.dtype,
                                                         device=nodes.device), plan.unique_count)
        grads, relation_grads, loss = self.step.gradients(plan, rows, dropout)
        self.loss.add_(loss * len(plan.edges))
        sent.fill_(plan.rows, plan.unique_count, grads, list(relation_grads))

    def _apply(self, index: int, nodes, state, events: dict) -> None:
        done = events[index]
        with on(self.update):
            done["work"].wait()  # (the update stream waits for the collective; on CPU, the host does)
            if done["graphed"]:
                self._graphs(index % 2, nodes, state)["apply"].replay()
            else:
                self.apply_all(done["received"], nodes, state)
            done["applied"] = record(self.update)
        if done["graphed"]:
            self.step.count_relation_step()
        elif done["full"] and self.use_graphs:
            self.warmed_up = True

    def apply_all(self, received: list[Gradients], nodes, state, count: bool = True) -> None:
        """Every rank's gradients in rank order, then the relations with their sum (``count`` False in a
        graph: the relation step's host-side count stays out)."""
        apply_in_order(self.step, self.node_update, received, nodes, state, count)

    # ---- buffers and graphs ----
    def _buffers(self, parity: int, nodes, state) -> tuple[Gradients, torch.Tensor, list[Gradients]]:
        """(what this rank sends, the gathered buffer, every rank's view of it) for steps of this parity."""
        if self.buffers[parity] is None:
            sent = self._empty_gradients(nodes)
            gathered = torch.empty(self.world * sent.nbytes(), dtype=torch.uint8, device=self.device)
            size = sent.nbytes()
            received = [Gradients.viewing(gathered[r * size:(r + 1) * size], sent.spec()) for r in range(self.world)]
            self.buffers[parity] = (sent, gathered, received)
        return self.buffers[parity]

    def _empty_gradients(self, nodes: torch.Tensor) -> Gradients:
        """Room for a full batch's gradients, shaped by one throwaway batch's (every rank sizes it alike)."""
        edges = torch.zeros(self.batch_size, 3, dtype=torch.long, device=self.device)
        draws = self.step.negative_draws(self.batch_size, None, torch.Generator(self.device).manual_seed(0))
        plan = self.step.plan_batch(edges, None, None, defer_count=True, draws=draws, table_rows=len(nodes))
        rows = gather_rows(nodes, plan.rows, torch.empty(len(plan.rows), nodes.shape[1], dtype=nodes.dtype,
                                                         device=nodes.device), plan.unique_count)
        grads, relation_grads, _ = self.step.gradients(plan, rows, torch.Generator(self.device).manual_seed(0))
        return Gradients.empty(len(plan.rows), grads, list(relation_grads), self.device)

    def _check_graphs(self, nodes, state) -> None:
        if not self.use_graphs:  # (graphable steps name the relation tensors their graphs read)
            return
        key = (nodes.data_ptr(), state.data_ptr(), *[t.data_ptr() for t in self.step.relation_tensors()])
        if key != self.graph_key:
            self.graph_key, self.graphs = key, [None, None]

    def _graphs(self, parity: int, nodes, state) -> dict:
        if self.graphs[parity] is None:
            sent, _, received = self._buffers(parity, nodes, state)
            edges = torch.zeros(self.batch_size, 3, dtype=torch.long, device=self.device)
            draws = self.step.negative_draws(self.batch_size, None, torch.Generator(self.device).manual_seed(0))
            graphs = {"edges": edges, "draws": draws}
            graphs["compute"] = PhaseGraphs.graph_of(
                lambda _: self._gradients_into(sent, edges, draws, nodes, None), 0, self.device, 0)
            graphs["apply"] = PhaseGraphs.graph_of(
                lambda _: self.apply_all(received, nodes, state, count=False), 0, self.device, 0)
            self.graphs[parity] = graphs
        return self.graphs[parity]
