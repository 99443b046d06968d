"""The fused step as one CUDA graph: a few launches per batch instead of ~40.

Per batch, the host copies the edges into the graph's input buffer, draws the
negatives' random numbers into its draw buffers (outside the graph, from the
epoch's generator, so the draws are those of a run without graphs) and replays
the graph: planning (negatives, unique rows), the fused step and the relation
update run on the device with no Python between kernels. At d=100 the eager
fused step is bound by the host launching its kernels; the graph removes that.

Batches of another size (an epoch's last) and buffer states of an
out-of-core run (their candidate rows change) run eagerly.
"""

from __future__ import annotations

import torch

from marius_py.step.fused import FusedStep
from marius_py.pipeline.phase_graphs import capturing
from marius_py.pipeline.row_kernels import triton_available
from marius_py.negatives import CandidateRows


class GraphedFusedStep:
    """Captures ``FusedStep.apply`` of full batches once per table pair, then replays it."""

    def __init__(self, model, fused: FusedStep, batch_size: int):
        self.model, self.fused, self.batch_size = model, fused, batch_size
        self.key = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.batches_run = 0

    @staticmethod
    def supported(fused: FusedStep, device: torch.device) -> bool:
        """CUDA with Triton (the torch versions of the kernels read the row count on the host: not capturable),
        and no dropout (its mask is a random draw the graph would repeat)."""
        return device.type == "cuda" and triton_available() and fused.own_relation_step and fused.dropout == 0

    def run(self, batch: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor,
            candidates: CandidateRows | None, sampling: torch.Generator) -> bool:
        """Train ``batch`` through the graph; False (nothing done) where the graph does not apply."""
        if len(batch) != self.batch_size or not (candidates is None or candidates.is_identity) \
                or sampling.device.type != "cuda" or nodes.dtype != torch.float32:  # eager step otherwise
            return False
        key = (*[t.data_ptr() for t in (nodes, state, *self.fused.relation_tensors())], tuple(nodes.shape),
               tuple(state.shape), None if candidates is None else candidates.total)  # what the graph reads
        if key != self.key:
            self._allocate_inputs(key, batch, candidates)
        self.edges.copy_(batch, non_blocking=True)
        self.model.negative_draws(len(batch), candidates, sampling, out=self.draws)
        if self.graph is None:
            self._warm_up_then_capture(nodes, state, candidates)
        else:
            self.graph.replay()
        self.batches_run += 1
        self.fused.count_relation_step()
        return True

    def add_loss_to(self, loss_sum: torch.Tensor) -> None:
        """Move the loss the graph accumulated (summed over batches) into ``loss_sum``."""
        if self.key is not None:
            loss_sum.add_(self.loss)
            self.loss.zero_()

    def _allocate_inputs(self, key, batch: torch.Tensor, candidates: CandidateRows | None) -> None:
        self.key, self.graph = key, None
        self.edges = torch.empty_like(batch)
        throwaway = torch.Generator(batch.device).manual_seed(0)  # shapes only: the run's generator is not touched
        self.draws = self.model.negative_draws(len(batch), candidates, throwaway)
        self.loss = torch.zeros((), device=batch.device)
        self.unique_stream = torch.cuda.Stream(batch.device)
        self.warmed_up = False

    def _step(self, nodes, state, candidates) -> None:
        """Plan and fused step; the touched rows are found on a side stream while the scores are computed."""
        plan = self.model.plan_batch(self.edges, None, candidates, defer_count=True, draws=self.draws,
                                     unique_stream=self.unique_stream, table_rows=len(nodes))
        self.fused.apply(plan, nodes, state, self.loss, unique_stream=self.unique_stream)

    def _warm_up_then_capture(self, nodes, state, candidates) -> None:
        """First batch: an eager step on a side stream (compiles kernels, creates handles); second: capture."""
        device = nodes.device
        if not self.warmed_up:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                self._step(nodes, state, candidates)
            torch.cuda.current_stream(device).wait_stream(side)
            self.warmed_up = True
            return
        graph = torch.cuda.CUDAGraph()
        with capturing(graph):
            self._step(nodes, state, candidates)
        # Tensors made outside the graph that it reads (the cached row weights) must outlive it.
        self.kept_alive = self.fused.constants_used
        graph.replay()  # capture records without running: this batch runs now
        self.graph = graph
