"""Which training step each placement gets, handed to the pipeline as objects.

The pipeline (``pipeline/``) moves batches and rows; this module decides what a
batch computes there: the fused Dot/DistMult step with hand-written gradients
(``fused_step.py``), replayed as a CUDA graph (``step_graph.py``) where it can,
or the autograd step of ``trainer.Model``.
"""

from __future__ import annotations

import torch

from marius_py.config import Config
from marius_py.fused_step import FusedStep, supports_fused_step
from marius_py.step_graph import GraphedFusedStep
from pipeline.placements import PLACEMENT_DEVICE, PLACEMENT_HOST
from pipeline.row_kernels import zero_copy_available
from pipeline.span_runner import SpanRunner


def uses_fused_step(model, placement: str) -> bool:
    """The fused step updates tables in place: in GPU memory (synchronous there), or in pinned host memory
    through GPU kernels (the zero-copy path: updates are read-modify-writes in order)."""
    in_place = placement == PLACEMENT_DEVICE or placement == PLACEMENT_HOST and zero_copy_available()
    return in_place and model.config.training.fused_step and supports_fused_step(model)


def build_span_runner(model, placement: str, config: Config, device: torch.device) -> SpanRunner:
    """The pipeline runner of one device with the step its placement takes."""
    fused = FusedStep(model) if uses_fused_step(model, placement) else None
    graphed = None
    if fused is not None and placement == PLACEMENT_DEVICE and config.training.cuda_graphs \
            and GraphedFusedStep.supported(fused, device):
        graphed = GraphedFusedStep(model, fused, config.training.batch_size)
    return SpanRunner(model, placement, config.pipeline, device, config.training.batch_size, fused, graphed)
