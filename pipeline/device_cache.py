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


class RowCache:
    """GPU copies of some rows of a host table: ``embeddings[slot_of[row]]`` for rows with ``slot_of >= 0``."""

    def __init__(self, slot_of: torch.Tensor, embeddings: torch.Tensor, state: torch.Tensor):
        self.slot_of = slot_of          # [table rows] int32 on the device; -1: not cached
        self.embeddings = embeddings    # [capacity, d]
        self.state = state              # [capacity, state columns]
        self.rows = torch.empty(0, dtype=torch.long)  # table rows in slots 0.. (host)

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
        """Copy ``rows`` (host ids, unique, at most ``capacity``) of the host tables in; returns bytes moved."""
        if self.num_rows:
            raise RuntimeError("flush the cache before admitting other rows")
        rows = rows.cpu()
        count = len(rows)
        if count > self.capacity:
            raise ValueError(f"{count} rows do not fit a cache of {self.capacity}")
        device = self.embeddings.device
        self.embeddings[:count] = nodes[rows].to(device, self.embeddings.dtype)
        self.state[:count] = state[rows].to(device, self.state.dtype)
        self.slot_of[rows.to(device)] = torch.arange(count, dtype=torch.int32, device=device)
        self.rows = rows
        return count * (nodes.shape[1] + state.shape[1]) * nodes.element_size()

    def flush(self, nodes: torch.Tensor, state: torch.Tensor) -> int:
        """Write the cached rows back to the host tables and forget them; returns bytes moved."""
        count = self.num_rows
        if count:
            nodes[self.rows] = self.embeddings[:count].to(nodes.device, nodes.dtype)
            state[self.rows] = self.state[:count].to(state.device, state.dtype)
            self.slot_of[self.rows.to(self.slot_of.device)] = -1
            self.rows = torch.empty(0, dtype=torch.long)
        return count * (nodes.shape[1] + state.shape[1]) * nodes.element_size()


def hot_rows(edges: np.ndarray | torch.Tensor, table_rows: int, owner: int, num_devices: int,
             capacity: int) -> torch.Tensor:
    """The ``capacity`` rows owned by ``owner`` that are endpoints of the most ``edges`` (ascending ids).

    Hub nodes appear in most batches of a skewed graph: keeping them on their
    owner saves reading them over PCIe at every step. Rows that are no edge's
    endpoint are never chosen.
    """
    edges = torch.as_tensor(edges)
    degree = torch.bincount(torch.cat([edges[:, 0], edges[:, 2]]), minlength=table_rows)
    owned = torch.arange(owner, table_rows, num_devices)
    owned_degree = degree[owned]
    touched = int((owned_degree > 0).sum())
    keep = min(capacity, touched)
    if keep == 0:
        return torch.empty(0, dtype=torch.long)
    top = torch.topk(owned_degree, keep, sorted=False).indices
    return torch.sort(owned[top]).values
