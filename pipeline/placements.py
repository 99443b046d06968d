"""Placements: where the node tables live, and the stages a batch goes through for each.

A training step is three functions: ``load`` (negatives, rows, gathers, on the
tables' side), ``compute`` (forward, backward, optimizer maths, on the compute
device) and ``update`` (add the deltas into the tables). The placement decides
what joins them:

- ``cpu``: load -> compute -> update as threads; no transfers. At bound 1
  they run inline: the stages could not overlap anyway, and handing batches
  between threads measured ~15% slower on two cores.
- ``device`` (tables in GPU memory): no threads. Models the fused step serves
  (``supports_fused_step``: every decoder with the softmax loss) take it
  (``marius_py/step/fused.py``, optionally a CUDA graph),
  which reads no count on the host. Other models use ``run_planned_ahead``: each
  batch is planned on the GPU (negatives, touched rows with their count left
  on the device) ``staleness_bound`` batches before it runs; by then its row
  count has reached the host without stalling the GPU's queue. Gather,
  compute and update follow in stream order, so training stays synchronous
  whatever the bound. (Planning on a second thread measured slower: the two
  threads' kernel launches contend for the GIL.)
- ``host`` (tables in host memory, CUDA compute): with the fused step, the
  tables are pinned and GPU kernels read and write them in place on two
  streams (``SpanRunner._run_gathered``). Other models: batches staged in
  pinned memory through the full five stages, load -> host-to-device -> compute ->
  device-to-host -> update, with one CUDA stream per transfer direction and one
  for compute, ordered by events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import torch

from marius_py.pipeline.stages import Pipeline, Stage

PLACEMENT_CPU, PLACEMENT_DEVICE, PLACEMENT_HOST = "cpu", "device", "host"
PLACEMENT_REPLICATED, PLACEMENT_SPLIT = "replicated", "split"  # several devices, tables in GPU memory
CUDA_STALENESS_DEFAULT = 16  # host: batches in flight; device: batches planned ahead
DEVICE_MEMORY_FRACTION = 0.6  # of free GPU memory the tables may take; the rest is batch workspace


def choose_plan_device(zero_copy: bool, device: torch.device, table_device: torch.device,
                       edge_bytes: int) -> torch.device:
    """Where a span's edges are mapped and shuffled and its negatives drawn: where the runner plans batches.
    Zero-copy host tables plan on the GPU when the train edges (``edge_bytes``, twice: the span and its
    shuffled copy) fit in a quarter of its memory; the host then does no per-epoch shuffle and no per-batch
    pinning. Total memory, not free: the same run draws alike every time."""
    if not (zero_copy and device.type == "cuda"):
        return table_device
    total = torch.cuda.get_device_properties(device).total_memory
    return device if 2 * edge_bytes <= total // 4 else table_device


def choose_placement(requested: str, device_type: str, table_bytes: int, gpu_free: int = 0) -> str:
    """One device: ``cpu`` on a CPU; otherwise the requested placement, ``auto`` by whether the tables (or the
    buffer's slots) fit in the GPU's ``gpu_free`` bytes."""
    if device_type != "cuda":
        return PLACEMENT_CPU
    if requested in (PLACEMENT_REPLICATED, PLACEMENT_SPLIT):  # (several devices' choices; one GPU holds all)
        return PLACEMENT_DEVICE
    if requested != "auto":
        return requested
    return PLACEMENT_DEVICE if table_bytes <= DEVICE_MEMORY_FRACTION * gpu_free else PLACEMENT_HOST


def choose_devices_placement(requested: str, device_type: str, table_bytes: int, gpu_free: list[int],
                             partitioned: bool, dedup: bool = True) -> str:
    """Several devices: ``replicated`` (each holds all the tables), ``split`` (each holds the rows it owns)
    or ``host`` (tables or buffer in pinned host memory).

    ``auto`` and ``device`` keep the tables in GPU memory where they fit (``gpu_free``: each GPU's free bytes):
    replicated where each GPU holds them (no step waits for another GPU's rows),
    else split where they fit together (with dedup: only owners keep rows on
    their device), else host memory; a partition buffer always lives there.
    """
    if partitioned or requested == PLACEMENT_HOST:
        return PLACEMENT_HOST
    if requested in (PLACEMENT_REPLICATED, PLACEMENT_SPLIT):
        return requested
    if device_type != "cuda":
        return PLACEMENT_HOST if requested == "auto" else PLACEMENT_REPLICATED
    if table_bytes <= DEVICE_MEMORY_FRACTION * min(gpu_free):
        return PLACEMENT_REPLICATED
    if dedup and table_bytes <= DEVICE_MEMORY_FRACTION * sum(gpu_free):
        return PLACEMENT_SPLIT
    return PLACEMENT_HOST


def default_staleness(placement: str, requested: int) -> int:
    if requested:
        return requested
    if placement == PLACEMENT_CPU:
        return 1  # one host's cores: overlap buys little, and bound 1 is reproducible
    return CUDA_STALENESS_DEFAULT


def build_pipeline(placement: str, load: Callable, compute: Callable, update: Callable,
                   staleness_bound: int, device: torch.device, load_threads: int = 1,
                   queue_size: int = 0) -> Pipeline:
    """The pipeline of the ``cpu`` or ``host`` placement (see the module docstring).

    Compute and update run on one thread each: compute steps the relation
    parameters, and two threads adding into one table row could interleave.
    """
    if placement == PLACEMENT_CPU:
        return Pipeline([Stage("load", load, load_threads), Stage("compute", compute),
                         Stage("update", update)], staleness_bound, queue_size,
                        inline=staleness_bound == 1)  # threads that only hand over cost ~15% on CPU
    streams = _CudaStreams(device)
    return Pipeline([Stage("load", load, load_threads), Stage("host-to-device", streams.to_device),
                     Stage("compute", streams.compute_with(compute)),
                     Stage("device-to-host", streams.to_host), Stage("update", update)],
                    staleness_bound, queue_size)


def run_planned_ahead(batches: Iterable, plan: Callable, run: Callable, lookahead: int) -> None:
    """The ``device`` placement: ``run(plan(batch))``, each plan made ``lookahead`` batches early."""
    pending: deque = deque()
    for batch in batches:
        pending.append(plan(batch))
        if len(pending) > lookahead:
            run(pending.popleft())
    while pending:
        run(pending.popleft())


class _CudaStreams:
    """The host placement's transfer stages and the compute stream, ordered by events.

    Tensors made on one stream and used on another are marked with
    ``record_stream`` so the caching allocator does not hand their memory out
    again before the consuming stream is done with it.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.upload = torch.cuda.Stream(device)
        self.compute_stream = torch.cuda.Stream(device)
        self.download = torch.cuda.Stream(device)
        # Work queued before the pipeline (loss accumulator, restored relation parameters) comes first.
        launcher = torch.cuda.current_stream(device)
        for stream in (self.upload, self.compute_stream, self.download):
            stream.wait_stream(launcher)

    def to_device(self, item: Any) -> tuple[Any, torch.cuda.Event, list[torch.Tensor]]:
        """The host-to-device stage: the item's inputs copied on the upload stream."""
        with torch.cuda.stream(self.upload):
            moved = item.inputs_to(self.device)
            ready = torch.cuda.Event()
            ready.record(self.upload)
        return item, ready, moved

    def compute_with(self, compute: Callable) -> Callable:
        def run(entry):
            item, ready, moved = entry
            with torch.cuda.stream(self.compute_stream):
                self.compute_stream.wait_event(ready)
                for tensor in moved:
                    tensor.record_stream(self.compute_stream)
                item = compute(item)
                done = torch.cuda.Event()
                done.record(self.compute_stream)
            return item, done
        return run

    def to_host(self, entry) -> Any:
        item, done = entry
        with torch.cuda.stream(self.download):
            self.download.wait_event(done)
            for tensor in item.outputs():
                tensor.record_stream(self.download)
            item.outputs_to_host()
            copied = torch.cuda.Event()
            copied.record(self.download)
        copied.synchronize()  # the update stage reads the host copies
        return item
