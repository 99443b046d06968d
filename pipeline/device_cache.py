"""A device's cache of rows it owns: intra-GPU reuse across steps.

With several devices every row has one owner device, the only one that reads
it from the host and the only one that updates it (``pipeline.multi_device``).
So a copy the owner keeps in its own memory is never stale: the cached rows are
read and updated there (the row kernels follow ``slot_of``), and they cross
PCIe only when admitted and when flushed back to the host table. The rows to
keep are chosen per span (a buffer state or an in-memory epoch): the span's
most frequent endpoints (hub nodes), or all the owner's rows when they fit
(tables split across the GPUs' memory).
"""

from __future__ import annotations

import numpy as np
import torch

from marius_py.pipeline.row_kernels import move_rows


class RowCache:
    """GPU copies of some rows of a host table: ``embeddings[slot_of[row]]`` for rows with ``slot_of >= 0``."""

    def __init__(self, slot_of: torch.Tensor, embeddings: torch.Tensor, state: torch.Tensor):
        self.slot_of = slot_of          # [table rows] int32 on the device; -1: not cached
        self.embeddings = embeddings    # [capacity, d]
        self.state = state              # [capacity, state columns]
        self.rows = torch.empty(0, dtype=torch.long, device=slot_of.device)  # table rows in slots 0..

    @classmethod
    def empty(cls, table_rows: int, capacity: int, dim: int, state_dim: int, device: torch.device | str,
              dtype: torch.dtype = torch.float32) -> "RowCache":
        return cls(torch.full((table_rows,), -1, dtype=torch.int32, device=device),
                   torch.empty(capacity, dim, dtype=dtype, device=device),
                   torch.empty(capacity, state_dim, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return len(self.embeddings)

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def admit(self, rows: torch.Tensor, nodes: torch.Tensor, state: torch.Tensor) -> int:
        """Copy ``rows`` (unique, at most ``capacity``) of the host tables in; returns bytes moved."""
        if self.num_rows:
            raise RuntimeError("flush the cache before admitting other rows")
        count = len(rows)
        if count > self.capacity:
            raise ValueError(f"{count} rows do not fit a cache of {self.capacity}")
        self.rows = rows.to(self.slot_of.device)
        for table, copy in ((nodes, self.embeddings), (state, self.state)):
            _move(table, copy, count, source_rows=self.rows)
        self.slot_of[self.rows] = torch.arange(count, dtype=torch.int32, device=self.slot_of.device)
        return count * (nodes.shape[1] + state.shape[1]) * nodes.element_size()

    def write_back(self, nodes: torch.Tensor, state: torch.Tensor) -> int:
        """Copy the cached rows to the host tables, keeping them cached; returns bytes moved."""
        for table, copy in ((nodes, self.embeddings), (state, self.state)):
            _move(copy, table, self.num_rows, target_rows=self.rows)
        return self.num_rows * (nodes.shape[1] + state.shape[1]) * nodes.element_size()

    def flush(self, nodes: torch.Tensor, state: torch.Tensor) -> int:
        """Write the cached rows back to the host tables and forget them; returns bytes moved."""
        moved = self.write_back(nodes, state)
        self.forget()
        return moved

    def forget(self) -> None:
        """Drop the cached rows without writing them (the host tables hold them already)."""
        self.slot_of[self.rows] = -1
        self.rows = self.rows[:0]


def _move(source: torch.Tensor, target: torch.Tensor, count: int, source_rows: torch.Tensor | None = None,
          target_rows: torch.Tensor | None = None) -> None:
    """Rows between a host table and a cache: by the GPU in place when the host table is pinned (or on the
    same device), else indexed on the host and copied."""
    host = source if target.is_cuda else target
    if not count or source.device == target.device or host.is_pinned():
        move_rows(source, target, count, source_rows=source_rows, target_rows=target_rows)
    elif source_rows is not None:  # admission from a pageable table
        target[:count] = source[source_rows.cpu()].to(target.device, target.dtype)
    else:  # write-back into a pageable table
        target[target_rows.cpu()] = source[:count].to(target.device, target.dtype)


def endpoint_degree(edges: np.ndarray | torch.Tensor, table_rows: int) -> torch.Tensor:
    """How many of ``edges`` each row is an endpoint of."""
    edges = torch.as_tensor(edges)
    return torch.bincount(torch.cat([edges[:, 0], edges[:, 2]]), minlength=table_rows)


def hot_rows(degree: torch.Tensor, owner: int, num_devices: int, capacity: int) -> torch.Tensor:
    """The ``capacity`` rows owned by ``owner`` of highest ``degree`` (``endpoint_degree``), ascending ids.

    Hub nodes appear in most batches of a skewed graph: keeping them on their
    owner saves reading them over PCIe at every step. Rows that are no edge's
    endpoint are never chosen.
    """
    owned = torch.arange(owner, len(degree), num_devices, device=degree.device)
    owned_degree = degree[owned]
    keep = min(capacity, int((owned_degree > 0).sum()))
    if keep == 0:
        return torch.empty(0, dtype=torch.long, device=degree.device)
    top = torch.topk(owned_degree, keep, sorted=False).indices
    return torch.sort(owned[top]).values
