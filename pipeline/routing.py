"""Routing a step's rows between devices: each row has one owner (HongTu-style deduplication).

A step of G devices trains G batches at once, batch g on device g. Every
table row has one owner device, ``row % G`` (node ids are randomly permuted at
preprocessing, and a buffer's local rows inherit that, so each owner gets
about 1/G of any row set). Per step, each owner takes the union of the rows
the G batches request from it, reads each of them once (over PCIe, or from its
cache) and sends every device the rows it asked for (over NVLink); gradients
of those rows come back to the owner, which applies one update per row.

Everything here is tensor arithmetic without host synchronisation: counts stay
on the device until the caller reads them (planned steps ahead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.rows import unique_rows_async


def owner_of(rows: torch.Tensor, num_devices: int) -> torch.Tensor:
    return rows % num_devices


@dataclass
class GroupedRows:
    """One device's unique rows of a step, grouped by owner device (ascending within an owner)."""

    rows: torch.Tensor        # [L] owner 0's rows, owner 1's, ..., then padding
    local: torch.Tensor       # the plan's row positions, remapped into ``rows``
    per_owner: torch.Tensor   # [G] rows of each owner (on the device until read)


def group_by_owner(rows: torch.Tensor, local: torch.Tensor, count: torch.Tensor | None,
                   num_devices: int) -> GroupedRows:
    """Reorder a plan's unique ``rows`` (the first ``count`` real) by owner; ``local`` follows them."""
    positions = torch.arange(len(rows), device=rows.device)
    owners = owner_of(rows, num_devices)
    if count is not None:  # padding rows sort after every owner's
        owners = torch.where(positions < count, owners, num_devices)
    order = torch.sort(owners, stable=True).indices
    moved_to = torch.empty_like(order)
    moved_to[order] = positions
    per_owner = torch.zeros(num_devices + 1, dtype=torch.long, device=rows.device)
    per_owner.scatter_add_(0, owners, torch.ones_like(owners))
    return GroupedRows(rows[order], moved_to[local], per_owner[:num_devices])


@dataclass
class OwnerRows:
    """The union of the rows all devices request from one owner in a step."""

    rows: torch.Tensor              # unique rows, ascending, padded past ``count``
    count: torch.Tensor             # [1] on the owner
    positions: list[torch.Tensor]   # per requesting device: where each requested row sits in ``rows``


def union_of_requests(requests: list[torch.Tensor]) -> OwnerRows:
    """``requests[g]``: the rows device g asks of this owner (unique within g, on the owner's device)."""
    rows, local, count = unique_rows_async(torch.cat(requests))
    return OwnerRows(rows, count, list(torch.split(local, [len(r) for r in requests])))


def owner_offsets(per_owner: np.ndarray) -> np.ndarray:
    """Start of each owner's rows in a device's grouped rows."""
    return np.concatenate([[0], np.cumsum(per_owner)[:-1]])


@dataclass
class TransferCounters:
    """Rows and bytes a multi-device epoch moved, by direction.

    host->device: rows gathered from the host tables (each counted once per
    step and device that reads it), and their bytes together with the update's
    read-modify-writes and cache admissions; device->host: rows the updates and
    cache flushes write; device->device: rows an owner sends to another device
    (NVLink), with the returning gradients, the row requests and the relation
    gradients in the bytes. ``device_rows`` sums each device's row set per step,
    ``union_rows`` the owners' unions: rho = device_rows / union_rows. Device-side
    counts are summed as tensors and read only by ``snapshot``.
    """

    rows_host_to_device: int = 0
    bytes_host_to_device: int = 0
    rows_device_to_host: int = 0
    bytes_device_to_host: int = 0
    rows_device_to_device: int = 0
    bytes_device_to_device: int = 0
    device_rows: int = 0
    steps: int = 0
    _union_rows: list = field(default_factory=list)   # device tensors
    _cache_hits: list = field(default_factory=list)

    def add_owner_step(self, union_count: torch.Tensor, cache_hits: torch.Tensor | None) -> None:
        self._union_rows.append(union_count.reshape(()).to(torch.long))
        if cache_hits is not None:
            self._cache_hits.append(cache_hits.reshape(()).to(torch.long))

    def snapshot(self, embedding_bytes: int, row_bytes: int) -> dict:
        """Totals, reading the device-side counts (``row_bytes``: embedding + optimizer state of a row).

        With deduplication the owners' reads and read-modify-writes are the
        union minus the rows their caches served.
        """
        union = int(sum(t.item() for t in self._union_rows))
        hits = int(sum(t.item() for t in self._cache_hits))
        misses = union - hits if self._union_rows else 0
        h2d_rows = self.rows_host_to_device + misses
        return {
            "host_to_device": {"rows": h2d_rows,
                               "bytes": self.bytes_host_to_device + misses * (embedding_bytes + row_bytes)},
            "device_to_host": {"rows": self.rows_device_to_host + misses,
                               "bytes": self.bytes_device_to_host + misses * row_bytes},
            "device_to_device": {"rows": self.rows_device_to_device, "bytes": self.bytes_device_to_device},
            "device_rows": self.device_rows,
            "union_rows": union if self._union_rows else self.device_rows,
            "shared_rows": self.device_rows - union if self._union_rows else 0,
            "cache_hits": hits,
            "rho": self.device_rows / union if union else 1.0,
            "steps": self.steps,
        }
