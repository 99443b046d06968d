"""What the trainer calls on a runner: the one role every placement's runner plays.

A runner trains a span of edges into the node tables it is handed. One device
takes ``SpanRunner``; several take ``MultiDeviceRunner`` (host or split tables),
``ReplicatedRunner`` (a replica of the tables per device) or, with a process per
device, ``marius_py.step.replica_workers.ReplicaProcessesRunner``
(``marius_py.step.runners`` builds them). Each implements the whole of
``Runner``: a runner without a measure answers None for it, and one that holds
nothing to release closes as a no-op, so the trainer never asks whether a
member exists. ``tests/test_runners.py`` is the contract every runner passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class TransferCounts(Protocol):
    """Several devices' transfers in an epoch (``routing.TransferCounters``, ``replicated.ExchangeCounters``)."""

    def reset(self) -> None: ...

    def snapshot(self, embedding_bytes: int, row_bytes: int) -> dict: ...


@runtime_checkable
class Runner(Protocol):
    """Trains spans of edges in place into the node tables (see the module docstring)."""

    max_in_flight: int  # the most batches (or steps) in flight at once; the trainer zeroes it each epoch
    # Several devices' transfers; None on one device (the trainer reads them only with several)
    counters: TransferCounts | None
    host_seconds: float | None  # the host's seconds spent enqueuing steps, cumulative; None: not measured
    dedup: bool | None  # whether rows each device needs are read once per owner; None: not several host-table devices
    dedup_trial: dict | None  # pipeline.dedup=auto's timings of both modes once it has chosen; else None

    @property
    def zero_copy(self) -> bool:
        """Whether GPU kernels train host tables in place (the trainer then keeps them in pinned memory)."""

    @property
    def effective_staleness(self) -> int:
        """The bound on updates a batch may miss (1: synchronous)."""

    def run(self, edges: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor, candidates,
            sampling: torch.Generator | list[torch.Generator], dropout: torch.Generator | list[torch.Generator],
            loss_sum: torch.Tensor, on_batch: Callable[[int], None]) -> None:
        """Train ``edges`` (already shuffled) into ``nodes`` and ``state``; add each batch's loss x size to
        ``loss_sum`` and call ``on_batch`` with the batches done. One device takes one generator of each kind,
        several a list, one per device."""

    def close(self) -> None:
        """Release what the runner holds (a process group's workers); safe to call again."""
