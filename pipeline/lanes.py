"""Per-device CUDA streams (lanes) and the tensors of a multi-device step in flight.

``pipeline.multi_device`` runs a step's phases on each device's lanes, ordered
across devices by events; on a CPU the lanes are None and everything runs
inline. ``pipeline.phase_graphs`` reuses a ``StepState`` as a graph's static tensors.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from marius_py.pipeline.routing import GroupedRows, OwnerRows
LOAD_PRIORITY = -1  # CUDA stream priority of the load lanes (lower is higher; compute runs at 0)


@dataclass
class Lanes:
    """A device's streams: load (plan, host reads), compute (gradients, relation step) and update (the node
    rows' read-modify-write, which overlaps the next step's compute); None on a CPU.

    The load stream has the higher priority: its small kernels (sorts, the
    PCIe gather) otherwise wait for SMs behind the compute stream's large ones,
    and the next step's compute waits for them (measured: ~370 us of idle per
    step on two H200s at d=100).
    """

    load: torch.cuda.Stream | None
    compute: torch.cuda.Stream | None
    update: torch.cuda.Stream | None

    @classmethod
    def for_device(cls, device: torch.device) -> "Lanes":
        if device.type != "cuda":
            return cls(None, None, None)
        return cls(torch.cuda.Stream(device, priority=LOAD_PRIORITY), torch.cuda.Stream(device),
                   torch.cuda.Stream(device))


def on(*streams: torch.cuda.Stream | None):
    """Make each stream current on its device (nothing for CPU lanes); the last one's device is current."""
    stack = contextlib.ExitStack()
    for stream in streams:
        if stream is not None:
            stack.enter_context(torch.cuda.stream(stream))
    return stack


def record(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def wait(stream: torch.cuda.Stream | None, events) -> None:
    if stream is not None:
        for event in events:
            if event is not None:
                stream.wait_event(event)


@dataclass
class StepState:
    """One step's tensors, per device: made fresh (eager), or static and rewritten by graph replays."""

    edges: list                                     # per active device: [B, 3]
    draws: list = field(default_factory=list)       # per active device: negative draws
    plans: list = field(default_factory=list)       # per active device: the plan, rows grouped by owner
    grouped: list[GroupedRows] = field(default_factory=list)
    owners: list[OwnerRows] = field(default_factory=list)   # per owner: the union of the requests
    read: list = field(default_factory=list)        # per owner: its union's rows
    inputs: list = field(default_factory=list)      # per active device: its rows, grouped by owner
    grads: list = field(default_factory=list)       # per active device
    relation_grads: list = field(default_factory=list)
    index: int = 0
    planned: list = field(default_factory=list)     # events of the phases, per device
    loaded: list = field(default_factory=list)
    computed: list = field(default_factory=list)
    updated: list = field(default_factory=list)

    @property
    def active(self) -> int:
        """Devices with a batch in this step (the span's last step may not fill them all)."""
        return len(self.edges)

    def clear_events(self) -> None:
        self.planned, self.loaded, self.computed, self.updated = [], [], [], []


def enable_peer_access(devices: list[torch.device]) -> None:
    """Let every GPU read the others' memory (``move_rows`` does): torch enables peer access on a copy."""
    cuda = [d for d in devices if d.type == "cuda"]
    for source in cuda:
        for target in cuda:
            if source != target:
                torch.zeros(1, device=source).to(target)


def put(items: list, index: int, value) -> None:
    """``items[index] = value``, appending when the list is that short (fresh states grow in device order)."""
    if index < len(items):
        items[index] = value
    else:
        items.append(value)
