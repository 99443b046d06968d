"""Routing a step's rows between devices: each row has one owner (HongTu-style deduplication).

A step of G devices trains G batches at once, batch g on device g. Every
table row has one owner device, ``row % G`` (node ids are randomly permuted at
preprocessing, and a buffer's local rows inherit that, so each owner gets
about 1/G of any row set). Per step, each owner takes the union of the rows
the G batches request from it, reads each of them once (over PCIe, or from its
cache) and sends every device the rows it asked for (over NVLink); gradients
of those rows come back to the owner, which applies one update per row.

Shapes are static and counts stay on the devices: a device's rows are padded
to the length of its plan, an owner's requests to the sum of those lengths
(filled with a sentinel row that sorts last), and kernels read the counts where
they live. Nothing waits for the host, so a step can be replayed as CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from marius_py.pipeline.rows import unique_rows_async


def owner_of(rows: torch.Tensor, num_devices: int) -> torch.Tensor:
    return rows % num_devices


@dataclass
class GroupedRows:
    """One device's unique rows of a step, grouped by owner device (ascending within an owner)."""

    rows: torch.Tensor        # [L] owner 0's rows, owner 1's, ..., then padding
    local: torch.Tensor       # the plan's row positions, remapped into ``rows``
    per_owner: torch.Tensor   # [G] rows of each owner
    offsets: torch.Tensor     # [G] where each owner's rows start in ``rows``
    count: torch.Tensor       # [1] rows in all (the plan's unique rows)


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
    per_owner = per_owner[:num_devices]
    offsets = torch.cumsum(per_owner, 0) - per_owner
    return GroupedRows(rows[order], moved_to[local], per_owner, offsets, per_owner.sum().reshape(1))


@dataclass
class OwnerRows:
    """The union of the rows all devices request from one owner in a step."""

    rows: torch.Tensor              # unique rows, ascending, then the sentinel and padding
    count: torch.Tensor             # [1] real rows (the sentinel excluded)
    positions: list[torch.Tensor]   # per requesting device: where each requested row sits in ``rows``


def union_of_requests(requests: torch.Tensor, lengths: list[int], sentinel: int) -> OwnerRows:
    """``requests``: the devices' requests one after the other (``lengths`` each), padded with ``sentinel``
    (larger than any row)."""
    rows, local, count = unique_rows_async(requests, below_2_31=sentinel < 2**31 - 1)
    last = rows.gather(0, count - 1)
    real = count - (last == sentinel).to(count.dtype)
    return OwnerRows(rows, real, list(torch.split(local, lengths)))


# Slots of a device's counter tensor (summed on the device, read once per epoch), then OWNED slots per owner.
UNION_ROWS, CACHE_HITS, OWNED = 0, 1, 2
ID_BYTES = 8  # a row's id (int64), sent with its gradient to the owner


class TransferCounters:
    """Rows and bytes a multi-device epoch moved, by direction and by link.

    host->device: rows read from the host tables (per step, once per owner
    with deduplication, once per device that needs them without), with the
    update's read-modify-writes and cache admissions in the bytes;
    device->host: rows the updates and cache write-backs write; device->device:
    rows of a batch that another device owns: with dedup the owner sends the row
    (NVLink) and the gradient returns, with the row requests and the relation
    gradients in the bytes; without, the owner reads the gradient and the row's
    id. ``device_rows`` sums each device's row set per step, ``union_rows`` the
    owners' unions: rho = device_rows / union_rows. ``links``: the bytes of each
    device's host link (the device whose kernels move them) and of each pair of
    devices (sender, receiver). Edges (24 bytes each) and shared negatives' ids
    are not counted.

    Each device counts on itself, without the host waiting: its owners' unions
    and cache hits, and the rows of its batches each owner owns, per mode (the
    plan phase picks the block of ``dedup``, so a ``dedup=auto`` trial counts both
    modes' steps as they ran).
    """

    def __init__(self, devices: list[torch.device], dedup: bool):
        self.dedup, count = dedup, len(devices)
        slots = OWNED + 2 * count  # owned rows: with dedup, then without
        self.on_device = [torch.zeros(slots, dtype=torch.long, device=d) for d in devices]  # graphs add to these
        self.reset()

    def reset(self) -> None:
        """Start counting afresh (in place: captured graphs keep adding to the same device tensors)."""
        count = len(self.on_device)
        for counts in self.on_device:
            counts.zero_()
        self.admitted_rows = self.written_back_rows = 0
        self.admitted_bytes, self.written_back_bytes = [0] * count, [0] * count  # per owner
        self.relation_bytes = [[0] * count for _ in range(count)]  # [sender][receiver]
        self.steps = 0

    def count_planned(self, g: int, per_owner: torch.Tensor) -> None:
        """Device g's batch of a step: its rows of each owner (on device g; captured by graphs)."""
        start = OWNED + (0 if self.dedup else len(self.on_device))
        self.on_device[g][start:start + len(per_owner)].add_(per_owner)

    def count_relations(self, active: int, nbytes: int) -> None:
        """A step's all-reduce: every device pulls the relation gradients (``nbytes``) of each active one."""
        for sender in range(active):
            for receiver in range(len(self.on_device)):
                if receiver != sender:
                    self.relation_bytes[sender][receiver] += nbytes

    def snapshot(self, embedding_bytes: int, row_bytes: int) -> dict:
        """Totals and links (reads the devices' counts); ``row_bytes``: embedding + optimizer state of a row."""
        counts = [t.cpu().tolist() for t in self.on_device]
        n = len(counts)
        owned = [c[OWNED:OWNED + n] for c in counts]      # [device][owner], steps with dedup
        alone = [c[OWNED + n:OWNED + 2 * n] for c in counts]  # without
        union = [c[UNION_ROWS] for c in counts]
        hits = [c[CACHE_HITS] for c in counts]
        links = self._links(owned, alone, union, hits, embedding_bytes, row_bytes)
        read = sum(union) - sum(hits)  # owners' reads (dedup)
        gathered = sum(map(sum, alone))  # devices' own reads, and the owners' read-modify-writes (without)
        device_rows = sum(map(sum, owned)) + gathered
        union_rows = sum(union) + gathered
        received = sum(o[h] + a[h] for g, (o, a) in enumerate(zip(owned, alone)) for h in range(n) if h != g)
        return {
            "host_to_device": {"rows": read + gathered + self.admitted_rows, "bytes": sum(links["host_to_device"])},
            "device_to_host": {"rows": read + gathered + self.written_back_rows,
                               "bytes": sum(links["device_to_host"])},
            "device_to_device": {"rows": received, "bytes": sum(map(sum, links["device_to_device"]))},
            "device_rows": device_rows,
            "union_rows": union_rows,
            "shared_rows": device_rows - union_rows,
            "cache_hits": sum(hits),
            "rho": device_rows / union_rows if union_rows else 1.0,
            "steps": self.steps,
            "links": links,
        }

    def _links(self, owned, alone, union, hits, embedding_bytes: int, row_bytes: int) -> dict:
        """Bytes per host link and per pair of devices (see ``snapshot``)."""
        n = len(owned)
        gradient = embedding_bytes + ID_BYTES
        to_device, to_host = [], []
        for h in range(n):
            read = union[h] - hits[h]  # owner h's gathers and read-modify-writes (dedup)
            updated = sum(alone[g][h] for g in range(n))  # owner h's read-modify-writes (without)
            to_device.append(read * (embedding_bytes + row_bytes) + sum(alone[h]) * embedding_bytes
                             + updated * row_bytes + self.admitted_bytes[h])
            to_host.append((read + updated) * row_bytes + self.written_back_bytes[h])
        pairs = [row.copy() for row in self.relation_bytes]
        for g in range(n):
            for h in range(n):
                if h != g:
                    pairs[h][g] += owned[g][h] * embedding_bytes  # owner h's rows to device g (dedup)
                    pairs[g][h] += (owned[g][h] + alone[g][h]) * gradient  # g's ids and gradients to owner h
        return {"host_to_device": to_device, "device_to_host": to_host, "device_to_device": pairs}


def group_steps_by_head(edges: torch.Tensor, step_edges: int, num_devices: int, window_steps: int) -> torch.Tensor:
    """Step grouping (HongTu's chunk reorganisation in spirit): batches that run together share rows.

    Each window of ``window_steps`` steps is sorted by head, so a step's edges
    have few distinct heads, and every step's edges are dealt round-robin to
    its devices, so those heads are shared by all of them: a step reads fewer
    rows, and more of them serve several devices. Steps stop being uniform
    samples of the span: measure accuracy (bench/multi_gpu.py).
    """
    parts = []
    for start in range(0, len(edges), window_steps * step_edges):
        window = edges[start:start + window_steps * step_edges]
        window = window[torch.sort(window[:, 0], stable=True).indices]
        for first in range(0, len(window), step_edges):
            step = window[first:first + step_edges]
            parts.append(step[torch.cat([torch.arange(g, len(step), num_devices) for g in range(num_devices)])])
    return torch.cat(parts) if parts else edges
