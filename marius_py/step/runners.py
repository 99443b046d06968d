"""Which training step each placement gets, handed to the pipeline as objects.

The pipeline (``pipeline/``) moves batches and rows; this module decides what a
batch computes there: the fused step with hand-written gradients (every decoder with softmax CE)
(``fused.py``), replayed as a CUDA graph (``graph.py``) where it can, or the
autograd step of ``model.StepModel``.
"""

from __future__ import annotations

import functools

import torch

from marius_py.config import Config, dedup_setting
from marius_py.step.fused import FusedStep, gradient_step, supports_fused_step
from marius_py.step.graph import GraphedFusedStep
from marius_py.pipeline.multi_device import DEFAULT_STALENESS, MultiDeviceRunner
from marius_py.pipeline.placements import PLACEMENT_DEVICE, PLACEMENT_HOST, PLACEMENT_REPLICATED, PLACEMENT_SPLIT
from marius_py.pipeline.replicated import ReplicatedRunner
from marius_py.pipeline.row_kernels import sparse_adagrad_, zero_copy_available
from marius_py.pipeline.runner import Runner
from marius_py.pipeline.span_runner import SpanRunner

CACHE_MEMORY_FRACTION = 0.25  # of a device's free memory the automatic row cache may take


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


def build_multi_device_runner(replicas: list, placement: str, config: Config, devices: list[torch.device],
                              row_bytes: int) -> Runner:
    """Several devices training one model; ``replicas[g]``: the model on device g; ``placement``: replicated
    (``ReplicatedRunner``), split or host (``MultiDeviceRunner``); ``row_bytes``: a row's embedding and
    optimizer state."""
    steps = [gradient_step(model) for model in replicas]
    adagrad = replicas[0].node_optimizer
    update = functools.partial(sparse_adagrad_, lr=adagrad.lr, eps=adagrad.eps)
    p = config.pipeline
    staleness = p.staleness_bound or DEFAULT_STALENESS
    if placement == PLACEMENT_REPLICATED and p.processes == "per_device":
        from marius_py.step.replica_workers import ReplicaProcessesRunner  # (starts processes: only when asked)
        return ReplicaProcessesRunner(replicas[0], config, devices)
    if placement == PLACEMENT_REPLICATED:
        return ReplicatedRunner(steps, update, devices, config.training.batch_size, staleness,
                                graphs=config.training.cuda_graphs)
    cache_rows = p.cache_rows
    if cache_rows == -1:
        cache_rows = automatic_cache_rows(devices, row_bytes)
    # auto: timed on GPUs sharing host tables; split tables need owners, and on a CPU nothing crosses PCIe
    dedup = dedup_setting(p.dedup)
    if dedup == "auto" and (placement == PLACEMENT_SPLIT or devices[0].type != "cuda"):
        dedup = True
    return MultiDeviceRunner(steps, update, devices, config.training.batch_size, staleness,
                             dedup=dedup, cache_rows=cache_rows, cache_all=placement == PLACEMENT_SPLIT,
                             shared_negatives=config.training.shared_negatives, grouping_window=p.step_grouping,
                             graphs=config.training.cuda_graphs)


def automatic_cache_rows(devices: list[torch.device], row_bytes: int) -> int:
    """Rows a quarter of the smallest free device memory holds (none on a CPU: nothing crosses PCIe there)."""
    if devices[0].type != "cuda":
        return 0
    free = min(torch.cuda.mem_get_info(device)[0] for device in devices)
    return int(CACHE_MEMORY_FRACTION * free) // row_bytes
