"""Full multi-device steps replayed as CUDA graphs, one per phase and device.

Only the host's launches remain per step: each phase of every device is
captured once (after a full eager step has compiled its kernels) over two
alternating sets of static tensors, and replayed on the lanes, ordered by
events across devices. On a CPU the "graphs" run their phase again, so tests
exercise the static tensors.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

from marius_py.pipeline.lanes import LOAD_PRIORITY, StepState
from marius_py.pipeline.row_kernels import triton_available

GRAPH_STALENESS = 2  # graphed steps alternate between two sets of static tensors


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, **kwargs):
    """``torch.cuda.graph(graph, **kwargs)`` with Python's cycle collector held off.

    torch no longer collects before a capture, so a collection could start
    inside one and free an unreachable runner's graphs; destroying a graph
    while a stream captures is not permitted and breaks the capture (seen as
    "operation not permitted when stream is capturing (function reset)" and a
    wrong step). No collection starts until the capture ends; none is forced
    before it either (a full collection per graph, 20 graphs a runner).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    finally:
        if was_enabled:
            gc.enable()


class PhaseGraphs:
    """The phases of full steps as CUDA graphs: per device and phase (plan, read, compute, relations,
    update), over two alternating sets of static tensors. Captured once a full eager step has finished
    (kernels compiled, library handles made); captured again when the tables, caches or relation tensors
    change. Each graph reads other devices' static tensors through peer access."""

    def __init__(self, runner):
        self.runner = runner
        self.states: list[StepState | None] = [None, None]
        self.graphs: list[dict | None] = [None, None]
        self.key = None
        self.warmed_up = False  # a full step has finished eagerly: kernels compiled, library handles made

    @staticmethod
    def supported(runner) -> bool:
        """CUDA with Triton, steps that can apply relation gradients without host work."""
        return (triton_available() and all(d.type == "cuda" for d in runner.devices)
                and all(getattr(s, "graphable", False) for s in runner.steps))

    def ready_for(self, context) -> bool:
        """Whether this step may use graphs: in-memory candidates, and a full eager step already finished
        (capturing cannot compile kernels or create cuBLAS handles)."""
        if any(c is not None and not c.is_identity for c in context.candidates):
            return False
        key = (context.nodes.data_ptr(), context.state.data_ptr(),
               *[(c.slot_of.data_ptr(), c.embeddings.data_ptr()) if c is not None else None
                 for c in self.runner.caches],
               *[t.data_ptr() for step in self.runner.steps for t in step.relation_tensors()])
        if key != self.key:
            self.key, self.graphs, self.states = key, [None, None], [None, None]
        return self.warmed_up

    def state_for(self, index: int) -> StepState:
        parity = index % 2
        if self.states[parity] is None:
            runner = self.runner
            throwaway = [torch.Generator(d).manual_seed(0) for d in runner.devices]
            state = StepState([torch.empty(runner.batch_size, 3, dtype=torch.long, device=d)
                                for d in runner.devices])
            state.draws = [step.negative_draws(runner.batch_size, None, generator)
                           for step, generator in zip(runner.steps, throwaway)]
            self.states[parity] = state
        return self.states[parity]

    def replays(self, step: StepState, half: str, context) -> bool:
        """Run a half of a graphed step (``load`` or ``finish``): capture it first if needed."""
        parity = step.index % 2
        if step is not self.states[parity]:
            return False
        if self.graphs[parity] is None:
            self.graphs[parity] = self._capture(step, context)
        runner, graphs = self.runner, self.graphs[parity]
        devices = range(runner.num_devices)
        if half == "load":
            runner.run_phase(devices, "load", [], lambda g: graphs["plan"][g].replay(), step.planned)
            runner.run_phase(devices, "load", step.planned, lambda g: graphs["read"][g].replay(), step.loaded)
        else:
            runner.run_phase(devices, "compute", step.loaded, lambda g: graphs["compute"][g].replay(), step.computed)
            runner.run_phase(devices, "compute", step.computed, lambda g: graphs["relations"][g].replay(), [])
            runner.run_updates(step, lambda g: graphs["update"][g].replay())
            for model in runner.steps:
                model.count_relation_step()
        return True

    def _capture(self, step: StepState, context) -> dict:
        """Capture the five phases on every device, in phase order (each reads what the last one made)."""
        runner = self.runner
        phases = {"plan": lambda g: runner.plan_phase(step, g, context),
                  "read": lambda g: runner.read_phase(step, g, context),
                  "compute": lambda g: runner.compute_phase(step, g, context),
                  "relations": lambda g: runner.relations_phase(step, g, count=False),
                  "update": lambda g: runner.update_phase(step, g, context)}
        graphs = {}
        for name, phase in phases.items():
            priority = LOAD_PRIORITY if name in ("plan", "read") else 0  # kernels keep their stream's priority
            graphs[name] = [self.graph_of(phase, g, device, priority) for g, device in enumerate(runner.devices)]
        return graphs

    @staticmethod
    def graph_of(phase: Callable, g: int, device: torch.device, priority: int):
        """A phase captured on its device; on a CPU (tests of the static tensors) the phase itself."""
        if device.type != "cuda":
            return Replayed(lambda: phase(g))
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device, priority=priority)
        with torch.cuda.device(device), capturing(graph, stream=stream, capture_error_mode="thread_local"):
            phase(g)
        return graph


@dataclass
class Replayed:
    """A phase run again at each replay (CPU devices have no graphs)."""

    run: Callable

    def replay(self) -> None:
        self.run()
