"""The rows a batch touches, found without a host synchronisation on CUDA."""

from __future__ import annotations

import torch


def unique_rows(ids: torch.Tensor, padding: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, local) with ``rows[local] == ids`` and every id once in ``rows``.

    On CPU this is ``torch.unique``. On CUDA, ``torch.unique`` must copy the
    count of unique ids to the host, which stalls the launching thread until
    the device catches up; here ``rows`` instead has ``len(ids)`` entries: the
    unique ids in ascending order, then the tail of ``padding`` (valid rows of
    the table; default: copies of the smallest id). No ``local`` points at the
    padding entries, so their gradients, and so their additive updates, are
    exactly zero. Distinct padding rows keep the updates' atomic adds from
    piling onto one row.
    """
    if ids.device.type != "cuda":
        return torch.unique(ids, return_inverse=True)
    sorted_ids, order = torch.sort(ids)
    starts = torch.ones_like(sorted_ids, dtype=torch.bool)
    starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
    slot = torch.cumsum(starts, 0) - 1
    local = torch.empty_like(ids)
    local[order] = slot
    rows = sorted_ids[:1].repeat(len(ids)) if padding is None else padding.clone()
    rows[slot] = sorted_ids  # duplicates of an id write the same value
    return rows, local
